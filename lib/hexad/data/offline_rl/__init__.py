"""Offline RL data sets generated here (never downloaded), stored as npz with D4RL field names.

PointMaze (gymnasium-robotics ``PointMaze_UMaze-v3``): a scripted noisy waypoint oracle, in the
manner of D4RL's maze2d (Fu et al. 2020, arXiv 2004.07219), drives the point mass to goals that
the environment resamples each time one is reached (``continuing_task=True``,
``reset_target=True``). The oracle follows the shortest path over the maze's free cells (breadth
first search) with a PD controller ``a = clip(10 (w - x) - v, -1, 1)`` towards the next cell
centre ``w`` (the goal itself in the goal's cell), plus Gaussian action noise.

Fields (D4RL names): ``observations [N, 4]`` (x, y, vx, vy), ``actions [N, 2]``,
``rewards [N]`` (sparse: 1 when the next position is within 0.5 of ``task_goal``),
``next_observations [N, 4]``, ``terminals [N]`` (all 0: mazes do not terminate),
``timeouts [N]`` (1 at the last step of each episode), ``infos/goal [N, 2]`` (the goal the oracle
was driving to), ``infos/qpos [N, 2]``, ``infos/qvel [N, 2]``, and ``task_goal [2]``.

Locomotion (gymnasium MuJoCo ``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``), in the manner
of D4RL's locomotion sets: the behaviour policies are soft actor-critics trained online by
:func:`hexad.policy.locomotion_dataset`, which stores here the levels that
:func:`locomotion_levels` picks from its snapshots (*random*, *medium*, *expert*, and
*medium-replay*, the replay buffer up to the medium snapshot), each collected with
:func:`collect_locomotion`. Extra fields: ``infos/x_velocity [N]``, ``infos/reward_forward [N]``
(so a shifted objective can be computed from the data), and scalars ``meta/policy_return``,
``meta/snapshot_step``, ``meta/random_return``, ``meta/expert_return``,
``meta/snapshot_returns [S]``.

AntMaze (gymnasium-robotics ``AntMaze_UMaze-v5``): D4RL's antmaze recipe at a small scale. A
direction-commanded ant controller (trained by :func:`hexad.policy.train_ant_controller` in
:class:`AntCommandEnv`) is driven by the scripted noisy oracle towards the next waypoint of the
:class:`MazeGeometry` shortest path (cells of size 4). Fields: those of PointMaze with
``observations [N, 29]`` (x, y, then ``Ant-v5``'s 27, D4RL's ant layout), ``actions [N, 8]``,
``infos/qpos [N, 15]``, ``infos/qvel [N, 14]``, ``task_goal`` the centre of cell (3, 1), and
``meta/controller_curve`` (from :func:`hexad.policy.antmaze_dataset`).

Files are generated once and cached in ``hexad.data.cache_dir("offline_rl")`` (``$HEXAD_CACHE``,
default ``~/.cache/hexad``), named by a hash of their settings (:func:`offline_rl_path`); a file
with missing fields or non-finite values is refused.
"""

from hexad.data.offline_rl._antmaze import (
    ANT_ACT_DIM,
    ANT_INPUT_DIM,
    ANT_OBS_DIM,
    ANTMAZE_ENV,
    ANTMAZE_SCALING,
    AntCommandEnv,
    ant_command_features,
    antmaze_geometry,
    antmaze_obs,
    antmaze_oracle,
    evaluate_antmaze,
    generate_antmaze,
    torso_yaw,
    upright,
)
from hexad.data.offline_rl._gym import env_major, make_vec, vec_step
from hexad.data.offline_rl._io import (
    CACHE_FOLDER,
    D4RL_FIELDS,
    load_offline_rl,
    offline_rl_path,
    save_offline_rl,
    spec_tag,
    validate_offline_rl,
)
from hexad.data.offline_rl._locomotion import (
    LOCOMOTION_ENVS,
    LOCOMOTION_LEVELS,
    LocomotionEnv,
    check_env_id,
    collect_locomotion,
    evaluate_locomotion,
    locomotion_levels,
    tracking_return_bound,
    tracking_reward,
    velocity_features,
)
from hexad.data.offline_rl._maze import (
    UMAZE,
    MazeGeometry,
    check_maze_args,
    collect_maze,
    evaluate_maze,
    maze_fields,
    sample_free_goals,
)
from hexad.data.offline_rl._pointmaze import (
    POINTMAZE_ENV,
    evaluate_pointmaze,
    generate_pointmaze,
    pointmaze_dataset,
    pointmaze_oracle,
)

__all__ = [
    "ANTMAZE_ENV",
    "ANTMAZE_SCALING",
    "ANT_ACT_DIM",
    "ANT_INPUT_DIM",
    "ANT_OBS_DIM",
    "CACHE_FOLDER",
    "D4RL_FIELDS",
    "LOCOMOTION_ENVS",
    "LOCOMOTION_LEVELS",
    "POINTMAZE_ENV",
    "UMAZE",
    "AntCommandEnv",
    "LocomotionEnv",
    "MazeGeometry",
    "ant_command_features",
    "antmaze_geometry",
    "antmaze_obs",
    "antmaze_oracle",
    "check_env_id",
    "check_maze_args",
    "collect_locomotion",
    "collect_maze",
    "env_major",
    "evaluate_antmaze",
    "evaluate_locomotion",
    "evaluate_maze",
    "evaluate_pointmaze",
    "generate_antmaze",
    "generate_pointmaze",
    "load_offline_rl",
    "locomotion_levels",
    "make_vec",
    "maze_fields",
    "offline_rl_path",
    "pointmaze_dataset",
    "pointmaze_oracle",
    "sample_free_goals",
    "save_offline_rl",
    "spec_tag",
    "torso_yaw",
    "tracking_return_bound",
    "tracking_reward",
    "upright",
    "validate_offline_rl",
    "vec_step",
    "velocity_features",
]
