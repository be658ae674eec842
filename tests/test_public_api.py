"""The public surface of each package, pinned: the names ``__all__`` exports and the
signatures of those functions and of those classes' public methods. A rename, a removed
name or a changed signature fails here, so it is a deliberate act: change the table in
the same commit and say why.

To see what changed, run this file; to rebuild the table after a deliberate change,
print ``{package: _surface(package) for package in PINNED}`` and paste it below.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest


def _signature(obj: Any) -> str | None:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def _describe(obj: Any) -> Any:
    if inspect.isclass(obj):
        out = {"__init__": _signature(obj)}
        if issubclass(obj, BaseException):
            return out
        for name, member in sorted(vars(obj).items()):
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                out[name] = _signature(member.__func__)
            elif isinstance(member, property):
                out[name] = "property"
            elif inspect.isfunction(member):
                out[name] = _signature(member)
        return out
    if callable(obj):
        return _signature(obj)
    return type(obj).__name__


def _surface(package: str) -> dict[str, Any]:
    module = importlib.import_module(package)
    return {name: _describe(getattr(module, name)) for name in sorted(module.__all__)}


PINNED = {'actors': {'AreaResize': {'__init__': "(in_shape: 'tuple[int, int]', out_shape: 'tuple[int, int]')",
                           'fill': "(self, stack: 'np.ndarray', a: 'np.ndarray') -> 'None'",
                           'push_max': "(self, stack: 'np.ndarray', a: 'np.ndarray', b: 'np.ndarray') -> 'None'"},
            'BatchedInference': {'__init__': "(pool: 'EnvPool', model: 'torch.nn.Module', device: 'str | "
                                             "torch.device' = 'cpu', rollouts: 'RolloutWriter | None' = None, "
                                             "weights: 'WeightStore | None' = None, seed: 'int' = 0, policy: "
                                             "'Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None' = "
                                             'None)',
                                 'core_state': "(self, half: 'int') -> 'tuple[torch.Tensor, ...]'",
                                 'statistics': "(self) -> 'InferenceStatistics'",
                                 'step': "(self, timeout: 'float | None' = None) -> 'int'"},
            'Env': {'__init__': '(*args, **kwargs)',
                    'close': "(self) -> 'None'",
                    'reset': "(self, obs_out: 'np.ndarray') -> 'None'",
                    'step': "(self, action: 'Any', obs_out: 'np.ndarray') -> 'tuple[float, bool, bool]'"},
            'EnvConfig': {'__init__': "(env_id: 'str', full_action_space: 'bool' = False, terminal_on_life_loss: "
                                      "'bool' = False, noop_max: 'int' = 30, frame_skip: 'int' = 4, frame_stack: "
                                      "'int' = 4, screen_size: 'int' = 84, max_episode_frames: 'int' = 108000, "
                                      "reward_clip: 'float | None' = None, gym_kwargs: 'dict[str, Any]' = <factory>) "
                                      '-> None',
                          'is_atari': 'property',
                          'make': "(self, seeds: 'np.random.SeedSequence') -> 'Env'",
                          'spec': "(self) -> 'EnvSpec'"},
            'EnvPool': {'__init__': "(env: 'str | EnvConfig', num_workers: 'int', envs_per_worker: 'int', halves: "
                                    "'int' = 2, seed: 'int' = 0, restarts: 'int' = 0, hang_timeout: 'float' = 60.0, "
                                    "spins: 'int' = 200)",
                        'close': "(self, grace: 'float' = 5.0) -> 'None'",
                        'closed': 'property',
                        'recv': "(self, timeout: 'float | None' = None) -> 'HalfBatch'",
                        'send': "(self, actions: 'Any' = None) -> 'None'",
                        'statistics': "(self) -> 'PoolStatistics'",
                        'worker_pids': 'property'},
            'EnvSpec': {'__init__': "(env_id: 'str', obs_shape: 'tuple[int, ...]', obs_dtype: 'np.dtype', "
                                    "action_shape: 'tuple[int, ...]' = (), action_dtype: 'np.dtype' = "
                                    "dtype('int64'), num_actions: 'int | None' = None, action_low: 'float | None' = "
                                    "None, action_high: 'float | None' = None) -> None",
                        'describe_actions': "(self) -> 'str'",
                        'discrete': 'property'},
            'EnvWorkerError': {'__init__': "(message: 'str', worker: 'int' = -1, report: 'str' = '')"},
            'HalfBatch': {'__init__': "(half: 'int', envs: 'range', obs: 'np.ndarray', reward: 'np.ndarray', done: "
                                      "'np.ndarray', episode_return: 'np.ndarray', episode_step: 'np.ndarray', "
                                      "episode_end: 'np.ndarray', action: 'np.ndarray') -> None"},
            'LocalPolicyActors': {'__init__': "(env: 'str | EnvConfig', make_model: 'Callable[[], torch.nn.Module]', "
                                              "weights: 'WeightStore', ring: 'TypedRing', num_actors: 'int', "
                                              "envs_per_actor: 'int', seed: 'int' = 0, restarts: 'int' = 0)",
                                  'check': "(self) -> 'None'",
                                  'close': "(self, grace: 'float' = 5.0) -> 'None'",
                                  'pids': 'property'},
            'PoolStatistics': {'__init__': "(batches: 'int', env_steps: 'int', frames: 'int', worker_env_seconds: "
                                           "'tuple[float, ...]', worker_wait_seconds: 'tuple[float, ...]', "
                                           "recv_wait_seconds: 'float', restarts: 'int', failures: 'tuple[str, "
                                           "...]') -> None"},
            'RolloutWriter': {'__init__': "(ring: 'TypedRing', groups: 'int', group_size: 'int', timeout: 'float | "
                                          "None' = None)",
                              'add': "(self, group: 'int', rows: 'dict[str, Any]') -> 'int'",
                              'flush': "(self, group: 'int') -> 'int'",
                              'row': "(self, group: 'int') -> 'int'"},
            'STEP_FIELDS': 'tuple',
            'core_state_fields': "(spec: 'Mapping[str, Any]') -> 'list[str]'",
            'frames_per_step': "(config: 'EnvConfig') -> 'int'",
            'seed_sequence': "(seed: 'int', index: 'int', generation: 'int' = 0) -> 'np.random.SeedSequence'",
            'trajectory_spec': "(spec: 'EnvSpec', unroll_length: 'int', num_logits: 'int | None' = None, "
                               "core_state_shapes: 'Sequence[Sequence[int]] | None' = None) -> 'dict[str, tuple[Any, "
                               "tuple[int, ...]]]'",
            'unroll_length': "(spec: 'Mapping[str, tuple[Any, tuple[int, ...]]]') -> 'int'"},
 'learners': {'ActorCritic': {'__init__': "(torso: 'nn.Module', num_actions: 'int', use_lstm: 'bool' = False, "
                                          "lstm_layers: 'int' = 1)",
                              'forward': "(self, obs: 'torch.Tensor', done: 'torch.Tensor | None' = None, "
                                         "core_state: 'tuple[torch.Tensor, ...]' = ()) -> 'ModelOutput'",
                              'initial_state': "(self, batch_size: 'int') -> 'tuple[torch.Tensor, ...]'",
                              'use_lstm': 'property'},
              'ImpalaLoss': {'__init__': "(total: ForwardRef('torch.Tensor'), policy_gradient: "
                                         "ForwardRef('torch.Tensor'), baseline: ForwardRef('torch.Tensor'), entropy: "
                                         "ForwardRef('torch.Tensor'))"},
              'Learner': {'__init__': "(model: 'ActorCritic', ring: 'TypedRing', config: 'LearnerConfig', weights: "
                                      "'WeightStore | None' = None, device: 'str | torch.device' = 'cpu')",
                          'forward': "(self, batch: 'dict[str, torch.Tensor]') -> 'ModelOutput'",
                          'join_group': "(self, broker: 'str', group: 'str' = 'default', **kwargs: 'Any') -> 'None'",
                          'load': "(self, path: 'str') -> 'None'",
                          'load_state_dict': "(self, state: 'dict[str, Any]') -> 'None'",
                          'save': "(self, path: 'str') -> 'None'",
                          'state_dict': "(self) -> 'dict[str, Any]'",
                          'statistics': "(self) -> 'LearnerStatistics'",
                          'step': "(self, timeout: 'float | None' = None) -> 'ImpalaLoss'",
                          'update': "(self, batch: 'dict[str, torch.Tensor]') -> 'ImpalaLoss'"},
              'LearnerConfig': {'__init__': "(batch_size: 'int' = 32, discount: 'float' = 0.99, reward_clip: 'float "
                                            "| None' = 1.0, baseline_cost: 'float' = 0.5, entropy_cost: 'float' = "
                                            "0.0006, grad_norm_clip: 'float | None' = 40.0, optimizer: "
                                            '"Literal[\'adam\', \'rmsprop\']" = \'adam\', learning_rate: \'float\' = '
                                            "0.0006, adam_eps: 'float' = 1e-08, rmsprop_alpha: 'float' = 0.99, "
                                            "rmsprop_eps: 'float' = 0.01, rmsprop_momentum: 'float' = 0.0, "
                                            'reduction: "Literal[\'sum\', \'mean\']" = \'mean\', total_frames: '
                                            "'int' = 0, frames_per_step: 'int' = 1) -> None",
                                'check': "(self) -> 'None'"},
              'MLPTorso': {'__init__': "(obs_dim: 'int', hidden: 'Sequence[int]' = (64, 64))",
                           'forward': "(self, obs: 'torch.Tensor') -> 'torch.Tensor'"},
              'ModelOutput': {'__init__': "(policy_logits: ForwardRef('torch.Tensor'), baseline: "
                                          "ForwardRef('torch.Tensor'), core_state: ForwardRef('tuple[torch.Tensor, "
                                          "...]'))"},
              'NatureTorso': {'__init__': "(obs_shape: 'Sequence[int]' = (4, 84, 84), hidden: 'int' = 512)",
                              'forward': "(self, obs: 'torch.Tensor') -> 'torch.Tensor'"},
              'ResNetTorso': {'__init__': "(obs_shape: 'Sequence[int]' = (4, 84, 84), channels: 'Sequence[int]' = "
                                          "(16, 32, 32), hidden: 'int' = 256)",
                              'forward': "(self, obs: 'torch.Tensor') -> 'torch.Tensor'"},
              'VTraceFromLogitsReturns': {'__init__': "(vs: ForwardRef('torch.Tensor'), pg_advantages: "
                                                      "ForwardRef('torch.Tensor'), log_rhos: "
                                                      "ForwardRef('torch.Tensor'), behaviour_action_log_probs: "
                                                      "ForwardRef('torch.Tensor'), target_action_log_probs: "
                                                      "ForwardRef('torch.Tensor'))"},
              'VTraceReturns': {'__init__': "(vs: ForwardRef('torch.Tensor'), pg_advantages: "
                                            "ForwardRef('torch.Tensor'))"},
              'action_log_probs': "(logits: 'torch.Tensor', actions: 'torch.Tensor') -> 'torch.Tensor'",
              'baseline_loss': "(advantages: 'torch.Tensor', reduction: 'Reduction' = 'sum') -> 'torch.Tensor'",
              'clip_rewards': "(rewards: 'torch.Tensor', clip: 'float | None' = 1.0) -> 'torch.Tensor'",
              'entropy': "(logits: 'torch.Tensor') -> 'torch.Tensor'",
              'entropy_loss': "(logits: 'torch.Tensor', reduction: 'Reduction' = 'sum') -> 'torch.Tensor'",
              'from_importance_weights': "(log_rhos: 'torch.Tensor', discounts: 'torch.Tensor', rewards: "
                                         "'torch.Tensor', values: 'torch.Tensor', bootstrap_value: 'torch.Tensor', "
                                         "clip_rho_threshold: 'float | None' = 1.0, clip_pg_rho_threshold: 'float | "
                                         "None' = 1.0, lambda_: 'float' = 1.0) -> 'VTraceReturns'",
              'from_logits': "(behaviour_logits: 'torch.Tensor', target_logits: 'torch.Tensor', actions: "
                             "'torch.Tensor', discounts: 'torch.Tensor', rewards: 'torch.Tensor', values: "
                             "'torch.Tensor', bootstrap_value: 'torch.Tensor', clip_rho_threshold: 'float | None' = "
                             "1.0, clip_pg_rho_threshold: 'float | None' = 1.0, lambda_: 'float' = 1.0) -> "
                             "'VTraceFromLogitsReturns'",
              'impala_loss': "(behaviour_logits: 'torch.Tensor', target_logits: 'torch.Tensor', actions: "
                             "'torch.Tensor', rewards: 'torch.Tensor', done: 'torch.Tensor', values: 'torch.Tensor', "
                             "bootstrap_value: 'torch.Tensor', *, discount: 'float' = 0.99, reward_clip: 'float | "
                             "None' = 1.0, baseline_cost: 'float' = 0.5, entropy_cost: 'float' = 0.0006, "
                             "clip_rho_threshold: 'float | None' = 1.0, clip_pg_rho_threshold: 'float | None' = 1.0, "
                             "lambda_: 'float' = 1.0, reduction: 'Reduction' = 'sum') -> 'ImpalaLoss'",
              'make_model': '(kind: "Literal[\'shallow\', \'deep\', \'mlp\']", obs_shape: \'Sequence[int]\', '
                            "num_actions: 'int', use_lstm: 'bool' = False) -> 'ActorCritic'",
              'policy_gradient_loss': "(target_action_log_probs: 'torch.Tensor', pg_advantages: 'torch.Tensor', "
                                      "reduction: 'Reduction' = 'sum') -> 'torch.Tensor'"},
 'shmpad': {'Abandoned': {'__init__': None},
            'AuthError': {'__init__': None},
            'Closed': {'__init__': None},
            'CourierClient': {'__init__': "(address: 'str', call_timeout: 'float | None' = None, name: 'str | None' "
                                          '= None)',
                              'call': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = None) -> "
                                      "'Any'",
                              'call_future': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = "
                                             "None) -> 'Future'",
                              'close': "(self) -> 'None'"},
            'CourierHandle': {'__init__': "(node: 'CourierNode | None' = None, endpoint: 'Endpoint | None' = None, "
                                          "**client_kwargs: 'Any')",
                              'address': 'property',
                              'dereference': "(self) -> 'Any'",
                              'endpoint': 'property',
                              'from_address': "(cls, address: 'str', *, name: 'str | None' = None, token_file: 'str "
                                              "| os.PathLike | None' = None) -> 'CourierHandle'",
                              'release': "(self, dereferenced: 'Any') -> 'None'",
                              'set_client_kwargs': "(self, **client_kwargs: 'Any') -> 'None'",
                              'tcp_address': 'property'},
            'CourierNode': {'__init__': "(constructor: 'Callable[..., Any]', *args: 'Any', courier_kwargs: 'dict | "
                                        "None' = None, **kwargs: 'Any')",
                            'address': 'property',
                            'allocate': "(self) -> 'None'",
                            'allocated': 'property',
                            'configure': "(self, *args: 'Any', **kwargs: 'Any') -> 'None'",
                            'create_handle': "(self) -> 'CourierHandle'",
                            'endpoint': 'property',
                            'free': "(self) -> 'None'",
                            'on_stop': "(self) -> 'None'"},
            'FrameError': {'__init__': None},
            'Handle': {'__init__': '()',
                       'connect': '(self, node: "\'Node\'", label: \'str\') -> \'None\'',
                       'dereference': "(self) -> 'Any'",
                       'release': "(self, dereferenced: 'Any') -> 'None'"},
            'LaunchType': {'__init__': '(value, names=None, *, module=None, qualname=None, type=None, start=1, '
                                       'boundary=None)'},
            'MPMCRing': {'__init__': "(segment: 'Segment')"},
            'MessageBatch': {'__init__': "(rows: 'np.ndarray', lengths: 'np.ndarray')",
                             'to_bytes': "(self) -> 'list[bytes]'"},
            'MultiProcessingColocation': {'__init__': "(nodes: 'Sequence[PyNode]', num_retries_on_failure: 'int' = "
                                                      '0)',
                                          'add_node': "(self, node: 'PyNode') -> 'Handle'",
                                          'inner_nodes': "(self) -> 'list[Node]'"},
            'MultiThreadingColocation': {'__init__': "(nodes: 'Sequence[PyNode]', return_on_first_completed: 'bool' "
                                                     '= False)',
                                         'add_node': "(self, node: 'PyNode') -> 'Handle'",
                                         'inner_nodes': "(self) -> 'list[Node]'"},
            'Node': {'__init__': "() -> 'None'",
                     'allocate': "(self) -> 'None'",
                     'create_handle': "(self) -> 'Handle'",
                     'free': "(self) -> 'None'",
                     'inner_nodes': '(self) -> "list[\'Node\']"',
                     'input_handles': 'property',
                     'on_stop': "(self) -> 'None'",
                     'run': "(self) -> 'None'"},
            'NodeFailed': {'__init__': "(label: 'str', index: 'int', exit_code: 'int | None', node_traceback: 'str' "
                                       "= '')"},
            'Program': {'__init__': "(name: 'str')",
                        'add_node': "(self, node: 'Node', label: 'str | None' = None) -> 'Handle'",
                        'get_all_nodes': "(self) -> 'list[Node]'",
                        'group': "(self, label: 'str') -> 'Iterator[None]'",
                        'groups': 'property'},
            'PyClassNode': {'__init__': "(constructor: 'Callable[..., Any]', *args: 'Any', **kwargs: 'Any')",
                            'disable_run': "(self) -> 'None'",
                            'enable_run': "(self) -> 'None'"},
            'PyNode': {'__init__': "(function: 'Callable[..., Any]', *args: 'Any', **kwargs: 'Any')",
                       'create_handle': "(self) -> 'Handle'",
                       'function': 'property',
                       'run': "(self) -> 'Any'"},
            'PythonProcess': {'__init__': "(args: 'dict' = <factory>, env: 'dict' = <factory>) -> None",
                              'argv': "(self) -> 'list[str]'"},
            'RemoteError': {'__init__': None},
            'RingNode': {'__init__': "(capacity: 'int', spec: 'Mapping[str, Any] | None' = None, slot_size: 'int | "
                                     "None' = None, multi: 'bool' = True)",
                         'attach': "(self) -> 'Any'"},
            'RingStatistics': {'__init__': "(capacity: 'int', size: 'int', puts: 'int', gets: 'int', bytes_put: "
                                           "'int', bytes_got: 'int', waits_full: 'int', waits_empty: 'int', "
                                           "dead_claims_skipped: 'int', closed: 'bool') -> None"},
            'SPSCRing': {'__init__': '(segment)', 'get_bytes': "(self, timeout: 'float | None' = None) -> 'bytes'"},
            'SegmentError': {'__init__': None},
            'ShmpadError': {'__init__': None},
            'TcpRpcClient': {'__init__': "(address: 'str | tuple[str, int]', token: 'bytes | str | None' = None, "
                                         "call_timeout: 'float | None' = None, name: 'str | None' = None, *, "
                                         "token_file: 'str | os.PathLike | None' = None, connect_timeout: 'float' = "
                                         "60.0, max_frame: 'int' = 268435456)",
                             'call': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = None) -> "
                                     "'Any'",
                             'call_future': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = None) "
                                            "-> 'Future'",
                             'close': "(self) -> 'None'"},
            'TcpRpcServer': {'__init__': "(obj: 'Any', address: 'str | tuple[str, int]' = '127.0.0.1:0', token: "
                                         "'bytes | str | None' = None, threads: 'int' = 16, max_frame: 'int' = "
                                         '268435456)',
                             'close': "(self, timeout: 'float' = 5.0) -> 'None'"},
            'Timeout': {'__init__': None},
            'TypedRing': {'__init__': "(ring: 'ByteRing')",
                          'attach': '(cls, name: \'str\') -> "\'TypedRing\'"',
                          'close': "(self) -> 'None'",
                          'closed': 'property',
                          'commit': "(self) -> 'None'",
                          'create': "(cls, spec: 'Spec', capacity: 'int', multi: 'bool' = True, name: 'str | None' = "
                                    'None) -> "\'TypedRing\'"',
                          'get': "(self, timeout: 'float | None' = None, torch: 'bool' = False) -> 'dict[str, Any]'",
                          'get_batch': "(self, batch_size: 'int', timeout: 'float | None' = None, torch: 'bool' = "
                                       "False) -> 'dict[str, Any]'",
                          'get_batch_nowait': "(self, batch_size: 'int', torch: 'bool' = False) -> 'dict[str, Any]'",
                          'get_nowait': "(self, torch: 'bool' = False) -> 'dict[str, Any]'",
                          'name': 'property',
                          'put': "(self, item: 'Mapping[str, Any]', timeout: 'float | None' = None) -> 'None'",
                          'put_nowait': "(self, item: 'Mapping[str, Any]') -> 'None'",
                          'release': "(self) -> 'None'",
                          'reserve': "(self, timeout: 'float | None' = None) -> 'dict[str, np.ndarray]'",
                          'reserve_nowait': "(self) -> 'dict[str, np.ndarray]'",
                          'statistics': "(self) -> 'RingStatistics'"},
            'WeightStore': {'__init__': "(segment: 'Segment')",
                            'attach': '(cls, name: \'str\') -> "\'WeightStore\'"',
                            'close': "(self) -> 'None'",
                            'create': "(cls, template: 'Mapping[str, Any] | Any', name: 'str | None' = None) -> "
                                      '"\'WeightStore\'"',
                            'name': 'property',
                            'names': 'property',
                            'publish': "(self, state: 'Mapping[str, Any] | Any') -> 'int'",
                            'pull': "(self, dst: 'Mapping[str, Any] | Any', newer_than: 'int | None' = None) -> "
                                    "'int'",
                            'pull_arrays': "(self, newer_than: 'int | None' = None) -> 'tuple[int, dict[str, "
                                           "np.ndarray] | None]'",
                            'spec': 'property',
                            'statistics': "(self) -> 'WeightStoreStatistics'",
                            'version': 'property',
                            'wait_for_version': "(self, newer_than: 'int | None' = None, timeout: 'float | None' = "
                                                "None) -> 'int'"},
            'WeightStoreNode': {'__init__': "(template: 'Any')", 'attach': "(self) -> 'Any'"},
            'WeightStoreStatistics': {'__init__': "(publishes: 'int', pulls: 'int', retries: 'int') -> None"},
            'WorkerManager': {'__init__': "(program: 'str', launch_type: 'str', processes: 'bool', "
                                          "termination_notice_secs: 'float')",
                              'add': "(self, label: 'str', index: 'int', node: 'Node', resources: 'PythonProcess | "
                                     "None') -> 'None'",
                              'cleanup_after_test': "(self, test_case: 'Any' = None) -> 'None'",
                              'exit_codes': "(self) -> 'dict[str, int | None]'",
                              'failure': 'property',
                              'pids': "(self) -> 'dict[str, int]'",
                              'start': "(self) -> 'None'",
                              'stop': "(self) -> 'None'",
                              'stop_and_wait': "(self) -> 'None'",
                              'stop_event': "(self) -> 'threading.Event'",
                              'track': "(self, nodes: 'Iterable[Node]') -> 'None'",
                              'wait': "(self, labels: 'Iterable[str] | None' = None, raise_error: 'bool' = True, "
                                      "return_on_first_completed: 'bool' = False) -> 'None'",
                              'wait_for_stop': "(self, timeout: 'float | None' = None) -> 'bool'"},
            'WouldBlock': {'__init__': None},
            'launch': "(programs: 'Program | Sequence[Program]', launch_type: 'LaunchType | str | None' = None, "
                      "local_resources: 'Mapping[str, PythonProcess] | None' = None, test_case: 'Any' = None, "
                      "terminal: 'str | None' = None, *, termination_notice_secs: 'float | None' = None, "
                      "serialize_py_nodes: 'bool | None' = None) -> 'WorkerManager'",
            'register_stop_handler': "(handler: 'Callable[[], None]') -> 'None'",
            'stop': "() -> 'None'",
            'stop_event': "() -> 'threading.Event'",
            'unregister_stop_handler': "(handler: 'Callable[[], None]') -> 'None'",
            'wait_for_stop': "(timeout: 'float | None' = None) -> 'bool'"},
 'shmpad.net': {'Accumulator': {'__init__': "(model: 'torch.nn.Module', optimizer: 'torch.optim.Optimizer | None' = "
                                            "None, scheduler: 'Any' = None, *, broker: 'str', group: 'str' = "
                                            "'default', name: 'str | None' = None, virtual_batch_size: 'int' = 0, "
                                            "host: 'str' = '127.0.0.1', port: 'int' = 0, token: 'bytes | str | None' "
                                            "= None, op_timeout: 'float' = 60.0, min_size: 'int' = 1, check_every: "
                                            "'int' = 100)",
                                'close': "(self) -> 'None'",
                                'connected': 'property',
                                'load_state_bytes': "(self, data: 'bytes') -> 'None'",
                                'ready': "(self, timeout: 'float | None' = None) -> 'bool'",
                                'reduce_gradients': "(self, batch_size: 'int') -> 'bool'",
                                'ring_key': 'property',
                                'size': 'property',
                                'skip_gradients': "(self) -> 'bool'",
                                'state_bytes': "(self) -> 'bytes'"},
                'Broker': {'__init__': "(host: 'str' = '127.0.0.1', port: 'int' = 4431, token: 'bytes | str | None' "
                                       "= None, heartbeat_s: 'float' = 1.0, timeout_s: 'float' = 10.0, settle_s: "
                                       "'float' = 1.0)",
                           'address': 'property',
                           'close': "(self) -> 'None'"},
                'Connection': {'__init__': "(sock: 'socket.socket', peer: 'str', max_frame: 'int' = 268435456, keys: "
                                           "'tuple[bytes, bytes]' = (b'', b''))",
                               'close': "(self) -> 'None'",
                               'closed': 'property',
                               'fileno': "(self) -> 'int'",
                               'recv': "(self) -> 'Frame'",
                               'recv_header': "(self) -> 'tuple[int, int, int, int]'",
                               'recv_into': "(self, view: 'memoryview', what: 'str' = 'data') -> 'None'",
                               'recv_json': "(self) -> 'dict'",
                               'send': "(self, kind: 'int', *parts: 'bytes | bytearray | memoryview', tag: 'int' = "
                                       "0, flags: 'int' = 0) -> 'None'",
                               'send_json': "(self, obj: 'dict', tag: 'int' = 0, flags: 'int' = 0) -> 'None'",
                               'settimeout': "(self, seconds: 'float | None') -> 'None'"},
                'GroupClient': {'__init__': "(broker: 'str', group: 'str', name: 'str', address: 'str', token: "
                                            "'bytes | str | None' = None, reconnect_max_s: 'float' = 2.0)",
                                'add_listener': "(self, fn: 'Callable[[Membership], None]') -> 'None'",
                                'close': "(self) -> 'None'",
                                'connected': 'property',
                                'last_error': 'property',
                                'membership': "(self) -> 'Membership | None'",
                                'start': "(self) -> 'GroupClient'",
                                'wait_membership': "(self, newer_than: 'tuple | None' = None, timeout: 'float | "
                                                   "None' = None) -> 'Membership | None'"},
                'Listener': {'__init__': "(handler, host: 'str' = '127.0.0.1', port: 'int' = 0, token: 'bytes | str "
                                         "| None' = None, max_frame: 'int' = 268435456, name: 'str' = "
                                         "'shmpad-listener', max_handshakes_per_ip: 'int' = 8)",
                             'address': 'property',
                             'close': "(self) -> 'None'"},
                'Member': {'__init__': "(name: ForwardRef('str'), address: ForwardRef('str'))"},
                'Membership': {'__init__': "(broker_id: ForwardRef('str'), epoch: ForwardRef('int'), members: "
                                           "ForwardRef('tuple[Member, ...]'))",
                               'key': 'property',
                               'names': 'property',
                               'rank': "(self, name: 'str') -> 'int'"},
                'Mesh': {'__init__': "(host: 'str' = '127.0.0.1', port: 'int' = 0, token: 'bytes | str | None' = "
                                     "None, park_timeout: 'float' = 60.0)",
                         'abandon': "(self, key: 'str', reason: 'str' = 'its group changed') -> 'None'",
                         'address': 'property',
                         'close': "(self) -> 'None'",
                         'port': 'property',
                         'ring': "(self, key: 'str', addresses: 'Sequence[str]', rank: 'int', timeout: 'float' = "
                                 "30.0, chunk_bytes: 'int' = 1048576) -> 'PeerRing'"},
                'PeerRing': {'__init__': "(key: 'str', rank: 'int', size: 'int', send_conn: 'Connection | None', "
                                         "recv_conn: 'Connection | None', timeout: 'float | None' = 30.0, "
                                         "chunk_bytes: 'int' = 1048576, on_close: 'Callable[[], None] | None' = "
                                         'None)',
                             'allreduce': "(self, array: 'np.ndarray', op: 'str' = 'sum', timeout: 'float | None' = "
                                          "None) -> 'None'",
                             'broadcast': "(self, array: 'np.ndarray', root: 'int', timeout: 'float | None' = None) "
                                          "-> 'None'",
                             'broadcast_bytes': "(self, data: 'bytes | None', root: 'int', timeout: 'float | None' = "
                                                "None) -> 'bytes'",
                             'close': "(self) -> 'None'",
                             'closed': 'property'},
                'connect': "(address: 'str | tuple[str, int]', token: 'bytes | str | None' = None, timeout: 'float' "
                           "= 10.0, max_frame: 'int' = 268435456) -> 'Connection'",
                'load_token': "(token: 'str | bytes | None' = None, token_file: 'str | os.PathLike | None' = None) "
                              "-> 'bytes'"},
 'shmpad.ringbuf': {'MPMCRing': {'__init__': "(segment: 'Segment')"},
                    'MessageBatch': {'__init__': "(rows: 'np.ndarray', lengths: 'np.ndarray')",
                                     'to_bytes': "(self) -> 'list[bytes]'"},
                    'RingStatistics': {'__init__': "(capacity: 'int', size: 'int', puts: 'int', gets: 'int', "
                                                   "bytes_put: 'int', bytes_got: 'int', waits_full: 'int', "
                                                   "waits_empty: 'int', dead_claims_skipped: 'int', closed: 'bool') "
                                                   '-> None'},
                    'SPSCRing': {'__init__': '(segment)',
                                 'get_bytes': "(self, timeout: 'float | None' = None) -> 'bytes'"},
                    'Segment': {'__init__': "(name: 'str', mm: 'mmap.mmap', kind: 'str', meta: 'dict[str, Any]', "
                                            "data_offset: 'int', created: 'bool' = False)",
                                'attach': '(cls, name: \'str\', kind: \'str\') -> "\'Segment\'"',
                                'close': "(self) -> 'None'",
                                'create': "(cls, kind: 'str', meta: 'dict[str, Any]', data_bytes: 'int', name: 'str "
                                          '| None\' = None) -> "\'Segment\'"',
                                'disown': "(self) -> 'None'",
                                'owned': 'property',
                                'unlink': "(self) -> 'None'"},
                    'TypedRing': {'__init__': "(ring: 'ByteRing')",
                                  'attach': '(cls, name: \'str\') -> "\'TypedRing\'"',
                                  'close': "(self) -> 'None'",
                                  'closed': 'property',
                                  'commit': "(self) -> 'None'",
                                  'create': "(cls, spec: 'Spec', capacity: 'int', multi: 'bool' = True, name: 'str | "
                                            'None\' = None) -> "\'TypedRing\'"',
                                  'get': "(self, timeout: 'float | None' = None, torch: 'bool' = False) -> "
                                         "'dict[str, Any]'",
                                  'get_batch': "(self, batch_size: 'int', timeout: 'float | None' = None, torch: "
                                               "'bool' = False) -> 'dict[str, Any]'",
                                  'get_batch_nowait': "(self, batch_size: 'int', torch: 'bool' = False) -> "
                                                      "'dict[str, Any]'",
                                  'get_nowait': "(self, torch: 'bool' = False) -> 'dict[str, Any]'",
                                  'name': 'property',
                                  'put': "(self, item: 'Mapping[str, Any]', timeout: 'float | None' = None) -> "
                                         "'None'",
                                  'put_nowait': "(self, item: 'Mapping[str, Any]') -> 'None'",
                                  'release': "(self) -> 'None'",
                                  'reserve': "(self, timeout: 'float | None' = None) -> 'dict[str, np.ndarray]'",
                                  'reserve_nowait': "(self) -> 'dict[str, np.ndarray]'",
                                  'statistics': "(self) -> 'RingStatistics'"},
                    'WeightStore': {'__init__': "(segment: 'Segment')",
                                    'attach': '(cls, name: \'str\') -> "\'WeightStore\'"',
                                    'close': "(self) -> 'None'",
                                    'create': "(cls, template: 'Mapping[str, Any] | Any', name: 'str | None' = None) "
                                              '-> "\'WeightStore\'"',
                                    'name': 'property',
                                    'names': 'property',
                                    'publish': "(self, state: 'Mapping[str, Any] | Any') -> 'int'",
                                    'pull': "(self, dst: 'Mapping[str, Any] | Any', newer_than: 'int | None' = None) "
                                            "-> 'int'",
                                    'pull_arrays': "(self, newer_than: 'int | None' = None) -> 'tuple[int, dict[str, "
                                                   "np.ndarray] | None]'",
                                    'spec': 'property',
                                    'statistics': "(self) -> 'WeightStoreStatistics'",
                                    'version': 'property',
                                    'wait_for_version': "(self, newer_than: 'int | None' = None, timeout: 'float | "
                                                        "None' = None) -> 'int'"},
                    'WeightStoreStatistics': {'__init__': "(publishes: 'int', pulls: 'int', retries: 'int') -> "
                                                          'None'}},
 'shmpad.rpc': {'RpcClient': {'__init__': "(address: 'str', call_timeout: 'float | None' = None, name: 'str | None' "
                                          '= None)',
                              'call': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = None) -> "
                                      "'Any'",
                              'call_future': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = "
                                             "None) -> 'Future'",
                              'close': "(self) -> 'None'"},
                'RpcServer': {'__init__': "(obj: 'Any', address: 'str | None' = None, threads: 'int' = 16)",
                              'close': "(self) -> 'None'",
                              'stop': "(self) -> 'None'",
                              'wait': "(self, timeout: 'float | None' = None) -> 'bool'"},
                'TcpRpcClient': {'__init__': "(address: 'str | tuple[str, int]', token: 'bytes | str | None' = None, "
                                             "call_timeout: 'float | None' = None, name: 'str | None' = None, *, "
                                             "token_file: 'str | os.PathLike | None' = None, connect_timeout: "
                                             "'float' = 60.0, max_frame: 'int' = 268435456)",
                                 'call': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = None) -> "
                                         "'Any'",
                                 'call_future': "(self, method: 'str', args: 'tuple' = (), kwargs: 'dict | None' = "
                                                "None) -> 'Future'",
                                 'close': "(self) -> 'None'"},
                'TcpRpcServer': {'__init__': "(obj: 'Any', address: 'str | tuple[str, int]' = '127.0.0.1:0', token: "
                                             "'bytes | str | None' = None, threads: 'int' = 16, max_frame: 'int' = "
                                             '268435456)',
                                 'close': "(self, timeout: 'float' = 5.0) -> 'None'"}}}



@pytest.mark.parametrize("package", sorted(PINNED))
def test_the_exported_names_are_the_pinned_ones(package):
    assert sorted(importlib.import_module(package).__all__) == sorted(PINNED[package])


@pytest.mark.parametrize(("package", "name"), [(p, n) for p in sorted(PINNED) for n in sorted(PINNED[p])])
def test_a_public_name_keeps_its_signatures(package, name):
    assert _describe(getattr(importlib.import_module(package), name)) == PINNED[package][name]
