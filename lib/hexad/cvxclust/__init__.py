r"""Convex clustering for transductive node classification (arXiv:2508.20231).

Two convex programs and their combination, each a pytree problem with a solver in the ott-jax
shape (``solver(problem, init=None) -> Output``, a ``lax.while_loop`` with a tolerance):

- :class:`FusionProblem` / :class:`FusionSolver`: convex clustering (sum-of-norms fusion) over
  a sparse edge list with squared, Huber or logistic losses and partial labels (squared or
  softmax cross-entropy label loss); the "node information alone" program;
  :func:`clusterpath`, :func:`fused_clusters`.
- :class:`NuclearProblem` / :class:`NuclearSolver`: graph clustering (full, weighted,
  partially observed; :func:`graph_problem`), PSD-hard as in the paper (``psd=True``, the
  default) or as the soft-PSD nuclear-norm program (``psd=False``), and the linear-reward
  surrogate joint program of graph, features and labels (:func:`joint_problem`);
  :func:`matrix_clusters`, :func:`assign_labels`, and a duality-gap certificate of any
  candidate (:func:`nuclear_certificate`, with :func:`psd_repair`, :func:`psd_rescale` and
  :func:`min_eigenvalue`);
- :class:`SharedAtomProblem` / :class:`SharedAtomSolver`: the joint program with one shared
  model per cluster (our convex shared-atomic-norm formulation; :func:`shared_atom_problem`,
  :func:`shared_atom_certificate`);
- :class:`FactorSolver`: a feasible point of either nuclear program from a non-negative
  low-rank factor :math:`L = V V^\top` (projected gradient, one ``[n, n] x [n, r]`` product a step):
  an upper bound, certified by a :class:`NuclearSolver` multiplier;
- :class:`SplitNuclearSolver` solves a :class:`NuclearProblem` exactly block by block
  (:func:`nuclear_blocks`: the connected components of the pairs whose entrywise optimum is
  not zero).
- :func:`label_propagation`: the label-spreading baseline (Zhou et al. 2004) on an edge list;
  :func:`balanced_weights` (Chen, Sanghavi & Xu's graph weights) and :func:`contextual_sbm`
  (graph, features and noisy labels of ``K`` planted communities).
"""

from hexad.cvxclust._baselines import label_propagation
from hexad.cvxclust._factor import FactorOutput, FactorSolver
from hexad.cvxclust._fusion import (
    FusionOutput,
    FusionPath,
    FusionProblem,
    FusionSolver,
    clusterpath,
    fused_clusters,
    fusion_dual_objective,
    fusion_objective,
    with_labels,
)
from hexad.cvxclust._graphs import (
    ContextualSBM,
    adjacency_from_edges,
    balanced_weights,
    check_adjacency,
    check_edges,
    contextual_sbm,
    knn_gaussian_weights,
)
from hexad.cvxclust._nuclear import (
    NuclearCertificate,
    NuclearOutput,
    NuclearProblem,
    NuclearSolver,
    assign_labels,
    box_violation,
    feature_similarity,
    graph_problem,
    joint_problem,
    label_similarity,
    matrix_clusters,
    min_eigenvalue,
    nuclear_certificate,
    nuclear_objective,
    psd_repair,
    psd_rescale,
    recovery_error,
)
from hexad.cvxclust._shared import (
    SharedAtomCertificate,
    SharedAtomOutput,
    SharedAtomProblem,
    SharedAtomSolver,
    shared_atom_certificate,
    shared_atom_objective,
    shared_atom_problem,
)
from hexad.cvxclust._split import SplitNuclearSolver, nuclear_blocks

__all__ = [
    "ContextualSBM",
    "FactorOutput",
    "FactorSolver",
    "FusionOutput",
    "FusionPath",
    "FusionProblem",
    "FusionSolver",
    "NuclearCertificate",
    "NuclearOutput",
    "NuclearProblem",
    "NuclearSolver",
    "SharedAtomCertificate",
    "SharedAtomOutput",
    "SharedAtomProblem",
    "SharedAtomSolver",
    "SplitNuclearSolver",
    "adjacency_from_edges",
    "assign_labels",
    "balanced_weights",
    "box_violation",
    "check_adjacency",
    "check_edges",
    "clusterpath",
    "contextual_sbm",
    "feature_similarity",
    "fused_clusters",
    "fusion_dual_objective",
    "fusion_objective",
    "graph_problem",
    "joint_problem",
    "knn_gaussian_weights",
    "label_propagation",
    "label_similarity",
    "matrix_clusters",
    "min_eigenvalue",
    "nuclear_blocks",
    "nuclear_certificate",
    "nuclear_objective",
    "psd_repair",
    "psd_rescale",
    "recovery_error",
    "shared_atom_certificate",
    "shared_atom_objective",
    "shared_atom_problem",
    "with_labels",
]
