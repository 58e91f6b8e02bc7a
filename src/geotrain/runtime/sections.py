"""The sections of a run's configuration: frozen dataclasses, one per concern, each validating itself.

Every field is a `setting`: its default and its help live here, once. The `geotrain train` flags
(geotrain.cli.config_flags) and the TOML file (geotrain.runtime.config_file) are generated from these
fields; errors name `section.key` and the value. Rules that span sections live in RuntimeConfig.
The model and optim sections live in runtime/config.py, beside the presets and optimizers they check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import numpy as np
import torch

from geotrain.codecs import CODECS, CodecError, CodecSpec
from geotrain.codecs.carrier import CARRIED_CODECS
from geotrain.codecs.delta import DELTA, DeltaSpec, is_delta
from geotrain.comm import check_reducer_spec, reducer_traits
from geotrain.emulate.install import COMPUTE_CLOCKS as EMULATED_CLOCKS
from geotrain.errors import GeotrainError
from geotrain.models import MODEL_PRESETS, TINY_GPT, GPTConfig
from geotrain.optim.outer import DILOCO_LR, DILOCO_MOMENTUM, LANDINGS, OuterStepError, check_outer_settings
from geotrain.cost.memory import OUTER_STATES
from geotrain.data import WINDOW_MODES
from geotrain.optim.registry import RUNTIME_OPTIMIZERS
from geotrain.runtime.batch_shares import BatchSharesError, parse_batch_shares
from geotrain.runtime.elastic.chaos import ChaosSpecError, Slow, parse_chaos, slow_only
from geotrain.runtime.pipeline_schedules import LOOPED_SCHEDULES, PIPELINE_SCHEDULES
from geotrain.runtime.stages import SPLIT_RULES
from geotrain.sync.adaptive import LOCAL_STEPS
from geotrain.cost.async_outer import STALENESS_POWER
from geotrain.sync.async_merge import ASYNC_MERGES
from geotrain.sync.async_outer import OUTER_SYNCS
from geotrain.sync.streaming import FRAGMENT_SPLITS


class RuntimeConfigError(GeotrainError, ValueError):
    """An invalid training option (named with its value and the allowed range)."""


NO_FLAG = ""
"""`flag=NO_FLAG`: a setting of the file only (a plan brings it, or nobody needs it on the command line)."""


def setting(default: Any, help: str, *, flag: str | None = None, metavar: str | None = None,
            choices: tuple[str, ...] | None = None) -> Any:
    """A config field: its default, its help (the one docstring of the field), its command-line flag
    (None: --the-key; NO_FLAG: none) and, for strings, the allowed values."""
    return field(default=default, metadata={"help": help, "flag": flag, "metavar": metavar, "choices": choices})


DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "bf16")
MIN_COMM_TIMEOUT_S = 1.0
"""Shortest accepted gloo timeout (seconds): the rendezvous of freshly started workers takes a few."""
PP_CODECS = (*(name for name, codec in CODECS.items() if codec.wire_float_dtype is not None), *CARRIED_CODECS, DELTA)
"""Codecs allowed for pipeline activations: torch's pipelining sends the float tensors a stage outputs, so
an activation codec is a float cast, or a codec whose packed bytes ride in a float32 carrier
(geotrain.codecs.carrier: its payload layout depends on the shape alone; top-k, rand-k, PowerSGD are refused),
or the per-sample delta wire (geotrain.codecs.delta, runtime/delta_wire.py)."""


@dataclass(frozen=True)
class Section:
    """Shared checks of the sections; `SECTION` is the table name in TOML and in error messages."""

    SECTION: ClassVar[str] = ""

    def _fail(self, key: str, text: str) -> NoReturn:
        raise RuntimeConfigError(f"{self.SECTION}.{key} {text}, got {getattr(self, key)!r}")

    def _integer(self, key: str, low: int, optional: bool = False) -> None:
        value = getattr(self, key)
        if optional and value is None:
            return
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            self._fail(key, f"must be an integer >= {low}")

    def _number(self, key: str, zero_ok: bool, optional: bool = False) -> None:
        """A finite float (ints from a file become floats), > 0 or >= 0."""
        value = getattr(self, key)
        if optional and value is None:
            return
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            self._fail(key, f"must be a finite number {'>= 0' if zero_ok else '> 0'}")
        object.__setattr__(self, key, float(value))

    def _flag(self, key: str) -> None:
        if not isinstance(getattr(self, key), bool):
            self._fail(key, "must be true or false")

    def _choice(self, key: str, allowed: tuple[str, ...]) -> None:
        if getattr(self, key) not in allowed:
            self._fail(key, f"must be one of {', '.join(allowed)}")

    def _text(self, key: str, optional: bool = False) -> None:
        value = getattr(self, key)
        if not (isinstance(value, str) or (optional and value is None)):
            self._fail(key, "must be a string")

    def _tuple(self, key: str) -> tuple[Any, ...]:
        """The list at `key` as a tuple (a file gives lists)."""
        value = getattr(self, key)
        if not isinstance(value, (tuple, list)):
            self._fail(key, "must be a list")
        object.__setattr__(self, key, tuple(value))
        return tuple(value)


@dataclass(frozen=True)
class RunSection(Section):
    """How long, where and with which seed this invocation runs."""

    SECTION: ClassVar[str] = "run"
    steps: int = setting(20, "training iterations (the learning-rate schedule spans them)")
    stop_after: int | None = setting(None, "stop this invocation after K steps (planned interruption)", metavar="K")
    seed: int = setting(0, "model initialisation seed")
    device: str = setting("cpu", "cpu (gloo, emulated links) or cuda (NCCL; needs --time-scale 0); auto: cuda if "
                                 "present", choices=DEVICES)
    precision: str = setting("fp32", "bf16: autocast", choices=PRECISIONS)
    threads: int = setting(1, "torch threads per worker")
    run_dir: str | None = setting(None, "write per-rank metrics (JSON Lines), a timeline trace and TensorBoard files "
                                        "here (geotrain.observe); `geotrain train` picks geotrain-runs/<time>-<plan> "
                                        "when not given, 'none': no run directory", metavar="DIR")

    def __post_init__(self) -> None:
        self._integer("steps", 1)
        self._integer("stop_after", 1, optional=True)
        self._integer("seed", 0)
        self._integer("threads", 1)
        self._text("run_dir", optional=True)
        self._choice("device", DEVICES)
        self._choice("precision", PRECISIONS)
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeConfigError("run.device cuda: torch sees no CUDA device here (use --device cpu or auto)")


@dataclass(frozen=True)
class DataSection(Section):
    """The training text and the held-out validation."""

    SECTION: ClassVar[str] = "data"
    data: str | None = setting(None, "text / jsonl / token file (or a directory of them); default: the synthetic "
                                     "world", metavar="FILE|DIR")
    data_seed: int = setting(0, "world text and batch seed")
    windows: str = setting("random", "how training windows are drawn: random (any start offset) or epochs (aligned "
                                     "windows, each once per epoch in a seeded order: the revisited samples that "
                                     "a delta pipeline codec needs)", choices=WINDOW_MODES)
    epoch_windows: int = setting(0, "--windows epochs: draw from the first N aligned windows only (0: all)",
                                 metavar="N")
    val_fraction: float = setting(0.1, "fraction of --data held out for validation")
    eval_every: int = setting(0, "validation loss every N steps and at the end (0: never)", metavar="N")
    eval_windows: int = setting(32, "validation windows per evaluation (at most)")
    eval_local: bool = setting(False, "one stage only: each replica scores its own weights on every window, with no "
                                      "collective and outside emulated time (a sync may be in flight: bench wan)")
    eval_offset: int = setting(0, "validation after steps k x eval_every + N instead (N below eval_every; bench wan: "
                                  "after an overlapped sync has landed)", metavar="N")

    def __post_init__(self) -> None:
        self._text("data", optional=True)
        self._choice("windows", WINDOW_MODES)
        self._integer("epoch_windows", 0)
        if self.epoch_windows and self.windows != "epochs":
            self._fail("epoch_windows", f"needs data.windows epochs (data.windows is {self.windows!r})")
        self._flag("eval_local")
        self._integer("eval_offset", 0)
        if self.eval_offset and self.eval_offset >= max(self.eval_every, 1):
            self._fail("eval_offset", f"must be below data.eval_every ({self.eval_every})")
        if self.data is not None and not Path(self.data).exists():
            raise RuntimeConfigError(f"data.data {self.data!r}: no such file or directory")
        self._integer("data_seed", 0)
        self._integer("eval_every", 0)
        self._integer("eval_windows", 1)
        value = self.val_fraction
        if not isinstance(value, float | int) or isinstance(value, bool) or not 0.0 <= value < 1.0:
            self._fail("val_fraction", "must be in [0, 1)")
        object.__setattr__(self, "val_fraction", float(value))
        if self.eval_every and self.val_fraction == 0:
            raise RuntimeConfigError("data.eval_every needs a held-out split: data.val_fraction is 0")

    def evaluates_after(self, step: int, steps: int) -> bool:
        """Whether validation runs after 0-based `step` of a run of `steps`: every eval_every steps (shifted
        by eval_offset) and at the end."""
        done = step + 1
        return bool(self.eval_every) and (done == steps or (done > self.eval_offset
                                                            and (done - self.eval_offset) % self.eval_every == 0))


@dataclass(frozen=True)
class ScheduleSection(Section):
    """The pipeline schedule, the batch and how the layers are cut into stages."""

    SECTION: ClassVar[str] = "schedule"
    schedule: str = setting("gpipe", "torch.distributed.pipelining schedule", choices=tuple(PIPELINE_SCHEDULES))
    microbatches: int = setting(4, "micro-batches per iteration")
    batch_size: int = setting(8, "sequences per replica per iteration")
    virtual_stages: int | None = setting(None, "stages per rank for interleaved-1f1b / looped-bfs (default 2)",
                                         metavar="V")
    split: str = setting("layers", "cut the layer list into stages by equal layer counts, parameter counts or "
                                   "measured time", choices=SPLIT_RULES)
    split_by_speed: bool = setting(False, "weight the --split by each stage's speed (its slowest replica's GPU peak "
                                          "FLOP/s from the cluster's gpu types): faster stages take more layers; "
                                          "equal GPUs: the plain split. A plan made with `geotrain plan "
                                          "--uneven-split` brings its own cut (used when it fits the model, else cut "
                                          "by speed)")
    split_boundaries: tuple[int, ...] = setting((), "a plan's cut: S + 1 increasing cut points from 0 over the plan "
                                                    "job's layers (used when it fits the model)", flag=NO_FLAG)
    batch_shares: str = setting("equal", "per-step data parallelism: how the global batch (replicas x batch_size) is "
                                         "shared out: equal, speed (by each replica's GPU peak FLOP/s), measured "
                                         "(speed, then re-balanced every 3 steps by measured compute) or weights "
                                         "W1,W2,... (one per replica); gradients are averaged weighted by samples "
                                         "(runtime/batch_shares.py)", metavar="equal|speed|measured|W1,W2,...")

    def __post_init__(self) -> None:
        self._choice("schedule", tuple(PIPELINE_SCHEDULES))
        self._choice("split", SPLIT_RULES)
        self._integer("microbatches", 1)
        self._integer("batch_size", 1)
        if self.batch_size % self.microbatches:
            self._fail("batch_size", f"must be a positive multiple of microbatches ({self.microbatches})")
        if self.virtual_stages is not None:
            looped = self.schedule in LOOPED_SCHEDULES
            value = self.virtual_stages
            if not isinstance(value, int) or isinstance(value, bool) or value < (2 if looped else 1) or (
                    not looped and value != 1):
                self._fail("virtual_stages", f"must be {'an integer >= 2' if looped else '1'} with schedule "
                                             f"{self.schedule!r}")
        self._flag("split_by_speed")
        try:
            parse_batch_shares(self.batch_shares)
        except BatchSharesError as exc:
            raise RuntimeConfigError(f"schedule.{exc}") from None
        cuts = self._tuple("split_boundaries")
        if cuts and (cuts[0] != 0 or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b <= a
                                         for a, b in zip(cuts, cuts[1:]))):
            self._fail("split_boundaries", "must be increasing cut points from 0 (or empty)")

    @property
    def stages_per_rank(self) -> int:
        """Virtual stages per rank (V): virtual_stages, else 2 for the looped schedules, else 1."""
        if self.virtual_stages is not None:
            return self.virtual_stages
        return 2 if self.schedule in LOOPED_SCHEDULES else 1


@dataclass(frozen=True)
class CommSection(Section):
    """The codecs of the data-parallel (gradient) and pipeline (activation) traffic."""

    SECTION: ClassVar[str] = "comm"
    dp_codec: CodecSpec = setting(CodecSpec("none"), "gradient codec of the data-parallel exchange, e.g. fp16, "
                                  "topk:fraction=0.01 (default: the plan's per-stage choice, else none)",
                                  metavar="CODEC[:k=v,...]")
    pp_codec: CodecSpec = setting(CodecSpec("none"), "activation (and activation gradient) codec of the pipeline "
                                  "cuts: none (fp32), fp16, bf16, or packed: int8-block, int4-block, int2-block, "
                                  "sign-block..., or per-sample deltas: delta:codec=int2-block,first=int8-block,"
                                  "grad=int2-block (default: the plan's per-cut choice, else none)",
                                  metavar="CODEC[:k=v,...]")
    dp_codecs: tuple[CodecSpec, ...] = setting((), "one gradient codec per stage (a plan's choice; empty: dp_codec "
                                               "everywhere)", flag=NO_FLAG)
    pp_codecs: tuple[CodecSpec, ...] = setting((), "one activation codec per pipeline cut (a plan's choice; empty: "
                                               "pp_codec everywhere)", flag=NO_FLAG)
    dp_hierarchical: bool = setting(False, "exchange DP gradients hierarchically: full precision inside each cluster "
                                           "region, --dp-codec (with error feedback) only between regions, sharded "
                                           "over the region's members (docs/history/hierarchical.md)")
    error_feedback: bool = setting(True, "send DP gradients without error feedback", flag="--no-error-feedback")

    def __post_init__(self) -> None:
        for key in ("dp_codec", "pp_codec"):
            object.__setattr__(self, key, self._spec(key, getattr(self, key)))
        for key in ("dp_codecs", "pp_codecs"):
            object.__setattr__(self, key, tuple(self._spec(key, spec) for spec in self._tuple(key)))
        for key in ("pp_codec", "pp_codecs"):
            for spec in (self.pp_codec,) if key == "pp_codec" else self.pp_codecs:
                if spec.name not in PP_CODECS:
                    why = (": torch.distributed.pipelining sends the float tensors a stage outputs, and this codec's "
                           "payload layout depends on the data (or on its state), so it cannot ride in one"
                           ) if spec.name in CODECS else ""
                    raise RuntimeConfigError(f"comm.{key}: pipeline codec must be one of {', '.join(PP_CODECS)}, "
                                             f"got {str(spec)!r}{why}")
        self._flag("dp_hierarchical")
        self._flag("error_feedback")
        flat_only = [str(spec) for spec in (self.dp_codec, *self.dp_codecs) if not reducer_traits(spec).hierarchical]
        if self.dp_hierarchical and flat_only:
            raise RuntimeConfigError(f"comm.dp_hierarchical: --dp-hierarchical takes a codec of geotrain.codecs; "
                                     f"{flat_only[0]} is its own exchange")

    def _spec(self, key: str, spec: Any) -> CodecSpec:
        """`spec` parsed and checked: a gradient reducer (any codec, or e.g. powersgd) or an activation codec."""
        label = "gradient" if key.startswith("dp") else "pipeline"
        try:
            parsed = CodecSpec.parse(spec)
            if label == "gradient":
                check_reducer_spec(parsed)
            elif is_delta(parsed):
                DeltaSpec.of(parsed)
            else:
                parsed.build()
        except (CodecError, TypeError) as exc:
            raise RuntimeConfigError(f"comm.{key}: {label} codec {str(spec)!r}: {exc}") from None
        return parsed

    def stage_dp_codec(self, stage: int) -> CodecSpec:
        """The DP codec of `stage`'s group."""
        return self.dp_codecs[stage] if self.dp_codecs else self.dp_codec

    def cut_pp_codec(self, cut: int) -> CodecSpec:
        """The activation codec of cut `cut` (between stage cut and cut + 1)."""
        return self.pp_codecs[cut] if self.pp_codecs else self.pp_codec

    def wire_dtypes(self) -> Any:
        """The activation wire (runtime.stages.Wire: a torch dtype, or a PackedWire for a quantising codec):
        one for every cut alike, or one per pipeline cut."""
        from geotrain.runtime.cut_wire import PackedWire
        from geotrain.runtime.delta_wire import DeltaWire

        def wire(spec: CodecSpec) -> Any:
            if is_delta(spec):
                return DeltaWire(spec)
            dtype = spec.build().wire_float_dtype
            return dtype if dtype is not None else PackedWire(spec)

        if len(set(self.pp_codecs)) > 1:
            return [wire(spec) for spec in self.pp_codecs]
        return wire(self.cut_pp_codec(0))


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Sharded checkpoints: where, how often, and whether to resume or start over."""

    SECTION: ClassVar[str] = "checkpoint"
    checkpoint_dir: str | None = setting(None, "write sharded checkpoints here", metavar="DIR")
    checkpoint_every: int = setting(0, "checkpoint every K steps (0: at the end only)")
    resume: bool = setting(False, "continue from the newest checkpoint in --checkpoint-dir")
    overwrite: bool = setting(False, "start a new run in a --checkpoint-dir that holds another run's checkpoints, "
                                     "deleting them (its latest pointer and step-* directories)")
    keep_checkpoints: int = setting(3, "keep the newest N complete checkpoints in --checkpoint-dir: after each new "
                                       "one, older step-* directories this checkpoint format wrote are deleted "
                                       "(never the latest one, nor the one a --resume started from)", metavar="N")

    def __post_init__(self) -> None:
        self._text("checkpoint_dir", optional=True)
        self._integer("checkpoint_every", 0)
        self._flag("resume")
        self._flag("overwrite")
        self._integer("keep_checkpoints", 1)
        for key in ("resume", "overwrite"):
            if getattr(self, key) and not self.checkpoint_dir:
                raise RuntimeConfigError(f"checkpoint.{key}: {key} needs a checkpoint directory")
        if self.resume and self.overwrite:
            raise RuntimeConfigError("checkpoint.resume and checkpoint.overwrite: resume and overwrite exclude "
                                     "each other")

    def due(self, completed: int, end: int) -> bool:
        """Whether a checkpoint is written after `completed` steps of a run (or launch) ending at `end`:
        every checkpoint_every steps and at the end, when there is a checkpoint directory."""
        every = self.checkpoint_every and completed % self.checkpoint_every == 0
        return self.checkpoint_dir is not None and bool(every or completed == end)

    def points(self, start: int, stop: int, steps: int) -> list[int]:
        """The steps in (start, stop] before the run's end (`steps`) at which a run of uneven ranks or groups
        (adaptive, asynchronous) writes a checkpoint: the due ones and the launch's `stop` (the end's is written
        apart)."""
        return [c for c in range(start + 1, stop + 1) if c < steps and (c == stop or self.due(c, stop))]


@dataclass(frozen=True)
class ReliabilitySection(Section):
    """How soon a lost worker or a stuck collective ends the run (seconds)."""

    SECTION: ClassVar[str] = "reliability"
    heartbeat_interval_s: float = setting(0.5, "seconds between a worker's heartbeats", flag=NO_FLAG)
    heartbeat_timeout_s: float = setting(10.0, "seconds without a heartbeat after which a worker counts as lost",
                                         flag="--heartbeat-timeout", metavar="SECONDS")
    comm_timeout_s: float = setting(120.0, "gloo collective/p2p timeout in seconds", flag="--comm-timeout",
                                    metavar="SECONDS")
    elastic: bool = setting(False, "elastic replica groups on torchft: a failed replica group is restarted and "
                                   "rejoins from a live peer while the others go on (docs/history/fault_tolerance.md)")
    min_replicas: int = setting(1, "--elastic: fewest live replica groups a step (or outer sync) needs",
                                metavar="K")
    max_restarts: int = setting(3, "--elastic: times the launcher restarts each failed replica group", metavar="N")
    chaos: str | None = setting(None, "failures to inject: with --elastic kill-site:every=20s, partition:... "
                                      "(seeded by --seed; docs/guide/surviving-failures.md); without --elastic "
                                      "slow:site=K,factor=F,at=T (replica K computes F x slower from T s of "
                                      "training on)", metavar="SPEC")
    lighthouse: str | None = setting(None, "--elastic: HOST:PORT of a running torchft lighthouse (default: the "
                                           "launcher starts one on this host)", metavar="HOST:PORT")
    netlab: bool = setting(False, "--elastic: run each replica group in a netlab namespace of its plan device "
                                  "(root; real shaped TCP; --chaos partitions set its link down; --time-scale 0)")

    def __post_init__(self) -> None:
        for key in ("heartbeat_interval_s", "heartbeat_timeout_s", "comm_timeout_s"):
            self._number(key, zero_ok=False)
        self._flag("elastic")
        self._integer("min_replicas", 1)
        self._integer("max_restarts", 0)
        self._text("chaos", optional=True)
        self._text("lighthouse", optional=True)
        self._flag("netlab")
        if self.chaos is not None:
            try:
                parse_chaos(self.chaos)
            except ChaosSpecError as exc:
                raise RuntimeConfigError(f"reliability.chaos: {exc}") from None
        if not self.elastic:
            # a slow-down fault is applied by the per-step workers; kills and partitions need the groups
            keys = ("min_replicas", "max_restarts", "lighthouse", "netlab") + (
                () if self.chaos is None or slow_only(self.chaos) else ("chaos",))
            for key in keys:
                if getattr(self, key) != self.__dataclass_fields__[key].default:
                    self._fail(key, "is an elastic run's setting: it needs reliability.elastic (--elastic)")
        elif self.chaos is not None and any(isinstance(f, Slow) for f in parse_chaos(self.chaos)):
            self._fail("chaos", "slow faults run without reliability.elastic (the elastic groups' workers do not "
                                "apply them)")
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_interval_s:
            self._fail("heartbeat_timeout_s", f"must be more than twice heartbeat_interval_s "
                                              f"({self.heartbeat_interval_s!r})")
        if self.comm_timeout_s < MIN_COMM_TIMEOUT_S:
            self._fail("comm_timeout_s", f"must be at least {MIN_COMM_TIMEOUT_S:g} s (workers need that long to "
                                         f"start and meet)")


COMPUTE_CLOCKS = tuple(EMULATED_CLOCKS)


@dataclass(frozen=True)
class EmulationSection(Section):
    """The emulated links and compute (geotrain.emulate)."""

    SECTION: ClassVar[str] = "emulation"
    time_scale: float = setting(1.0, "multiply every emulated link time by this (0: no emulation)")
    compute_clock: str = setting("wall", "how the emulated clock counts compute: wall or cpu seconds "
                                         "(geotrain.emulate.install)", flag=NO_FLAG, choices=COMPUTE_CLOCKS)
    emulate_gpu_speed: bool = setting(False, "emulated compute runs at each device's GPU speed: measured compute x "
                                             "(the cluster's fastest GPU's peak FLOP/s / the device's); the fastest "
                                             "computes at this machine's speed (needs --time-scale > 0; at 0 "
                                             "elastic asynchronous groups sleep out their device's slowness)")

    def __post_init__(self) -> None:
        self._number("time_scale", zero_ok=True)
        if self.compute_clock not in COMPUTE_CLOCKS:
            self._fail("compute_clock", "must be wall or cpu")
        self._flag("emulate_gpu_speed")


DEFAULT_SEQ_LEN = 128
"""Training sequence length (tokens) when --seq-len is not given and the model does not name a context."""


@dataclass(frozen=True)
class ModelSection(Section):
    """The model: a preset (`gpt` is its config) or a spec that builds the layer list."""

    SECTION: ClassVar[str] = "model"
    model_name: str = setting("tiny", "tiny (4 blocks, d_model 128, context 96), tiny-2layer, hf:PRESET|config.json|"
                                      "DIR (gpt2-tiny, llama-tiny, qwen2-tiny, mistral-tiny), path/to/file.py:function "
                                      "or package.module:function returning the layer list", flag="--model",
                              metavar="SPEC")
    seq_len: int | None = setting(None, "tokens per sequence (default: a tiny preset's context, else 128)")
    gpt: GPTConfig | None = field(default=None, metadata={"help": "the TinyGPT config (None: the preset "
                                                                  "model_name names, else TINY_GPT)", "internal": True})

    def __post_init__(self) -> None:
        self._text("model_name")
        name = self.model_name
        if name not in MODEL_PRESETS and name.rpartition(":")[1] == "" and not name.startswith("hf:"):
            raise RuntimeConfigError(f"model.model_name: --model {name!r}: not a preset ({', '.join(MODEL_PRESETS)}), "
                                     "hf:SPEC, file.py:function or package.module:function")
        self._integer("seq_len", 1, optional=True)
        if self.gpt is None:
            object.__setattr__(self, "gpt", MODEL_PRESETS.get(name, TINY_GPT))
        elif not isinstance(self.gpt, GPTConfig):
            self._fail("gpt", "must be a GPTConfig")

    @property
    def preset(self) -> bool:
        """True when model_name names a preset (its layers are `gpt`'s)."""
        return self.model_name in MODEL_PRESETS


@dataclass(frozen=True)
class OptimSection(Section):
    """The optimizer, its learning rate and clipping, and local SGD's outer step (geotrain.optim.outer)."""

    SECTION: ClassVar[str] = "optim"
    optimizer: str = setting("adamw", "adamw (after the --dp-codec exchange) or onebit-adam (1-bit Adam: averages "
                                      "over the stage's DP group itself, fp32 during its warm-up, 1-bit momenta after; "
                                      "needs --dp-codec none)", choices=RUNTIME_OPTIMIZERS)
    lr: float = setting(3e-3, "peak AdamW learning rate (warm-up + cosine)")
    onebit_warmup_steps: int = setting(5, "onebit-adam: full-precision AdamW steps before the variance freezes")
    clip_grad_norm: float | None = setting(None, "clip the gradient of the whole model (all stages, after DP "
                                                 "averaging) to global L2 norm X", metavar="X")
    sync_every: int | None = setting(None, "local SGD / DiLoCo: each replica steps AdamW on its own gradients and "
                                           "every H steps the DP exchange (--dp-codec, --dp-hierarchical) averages "
                                           "the parameter deltas, applied by an outer Nesterov SGD (default: average "
                                           "gradients every step)", metavar="H")
    outer_lr: float = setting(DILOCO_LR, "--sync-every: outer learning rate (DiLoCo: 0.7, made for 100+ outer "
                                         "steps; 1 with --outer-momentum 0 = parameter averaging, better on shorter "
                                         "runs, as the WAN recipe chooses)")
    outer_momentum: float = setting(DILOCO_MOMENTUM, "--sync-every: outer Nesterov momentum")
    outer_sync: str = setting("sync", "--sync-every: sync (every outer step waits for every replica), async (a "
                                      "replica sends its outer gradient to the global model in rank 0 and goes on "
                                      "without waiting; delayed Nesterov, staleness bound; --steps is the mean "
                                      "replica's budget) or async-hierarchical (each region's first rank merges its "
                                      "replicas first); docs/guide/heterogeneous-sites-async.md",
                              choices=OUTER_SYNCS)
    async_merge: str = setting("staleness", "--outer-sync async*: what the global model's server does to an arriving "
                                            "outer gradient: staleness (applies it as it came, weighed by "
                                            "--async-staleness-power) or heloco (a stale one first loses its "
                                            "component opposing the server's recent updates; "
                                            "geotrain.sync.async_merge)", choices=ASYNC_MERGES)
    async_staleness_power: float = setting(STALENESS_POWER, "--outer-sync async*: the server weighs an outer gradient "
                                                            "s versions stale (1 + s) ** -P (0: full weight, as the "
                                                            "inner steps it carries; 0.5 lost 0.05 nats on bench "
                                                            "hetero)", metavar="P")
    fragments: int = setting(1, "--sync-every: Streaming DiLoCo: cut the model into P fragments (contiguous layers, "
                                "balanced by bytes), fragment p synced every H steps at offset p*H/P, so the WAN "
                                "carries 1/P of the model at a time (1..H)", metavar="P")
    fragment_split: str = setting("layers", "--fragments: where the fragments are cut: layers (between tensors; a "
                                            "fragment holds at least its largest tensor) or bytes (at equal bytes, "
                                            "splitting the tensors the cuts fall in: each fragment 1/P of the model, "
                                            "so a dominant embedding or weight no longer sets the peak)",
                                  choices=FRAGMENT_SPLITS)
    sync_delay: int = setting(0, "steps an exchange travels while compute goes on (0: blocking). Without "
                                 "--sync-every: every step's gradients are applied TAU steps after they were "
                                 "computed (delayed gradients: the exchange overlaps the next TAU steps, replicas stay "
                                 "identical; needs a --dp-codec of geotrain.codecs, flat, adamw; no checkpoints "
                                 "before the end). With --sync-every: Streaming DiLoCo's tau, a fragment's outer "
                                 "exchange lands TAU inner steps later (0..H-1)", metavar="TAU")
    sync_mix: float = setting(0.0, "--sync-every: Streaming DiLoCo's alpha: a landed fragment becomes ALPHA x local + "
                                   "(1 - ALPHA) x new anchor (0..1; 0 drops the overlapped steps' local progress)",
                              metavar="ALPHA")
    sync_landing: str = setting("mix", "--sync-delay: how a late sync lands: mix (--sync-mix) or eager (the "
                                       "replica's own outer gradient applied at once as the mean's proxy, only the "
                                       "correction when the mean lands: no step on stale or dropped progress; needs "
                                       "--sync-mix 0)", choices=LANDINGS)
    sync_warmup: int = setting(0, "--sync-delay: outer syncs started before step N block (TAU 0): the overlap starts "
                                  "after the outer warm-up (early on a replica's own weights are far from the "
                                  "replicas' mean, and steps run from them cost quality)", metavar="N")
    sync_moments: bool = setting(False, "--sync-every: each outer sync also averages the inner AdamW's moments "
                                        "(the first through --dp-codec with error feedback, the second through "
                                        "log-block; in the same collective): every outer period starts from one "
                                        "optimizer state (docs/history/diloco.md, Moment sync)")
    moment_syncs: int | None = setting(None, "--sync-moments: only each fragment's first N outer syncs carry the "
                                             "moments, later ones the outer gradients alone (a third of the bytes "
                                             "with int4-block; on bench wan with eager landing as good as every "
                                             "sync with N = 1 or 2; default: every sync)", metavar="N")
    local_steps: str = setting("equal", "--sync-every: inner steps per outer period: equal (H on every replica) or "
                                        "adaptive (H_r by each replica's measured compute speed, H the mean, so "
                                        "sites reach the sync together; the plain outer mean; "
                                        "re-balanced at every sync; one fragment (--sync-delay overlaps the "
                                        "exchange with the next period), one pipeline stage: "
                                        "geotrain.sync.adaptive)", choices=LOCAL_STEPS)
    outer_state: str = setting("device", "--sync-every: where the outer state (anchors, outer momentum, the exchanged "
                                         "outer gradients, moment anchors) lives: device (beside the parameters) or "
                                         "host (CPU memory, pinned on CUDA, copied over one tensor at a time at each "
                                         "sync: the device holds the model, its gradients and AdamW only; the same "
                                         "numbers; the CUDA path has not run on a GPU)", choices=OUTER_STATES)

    def __post_init__(self) -> None:
        self._choice("optimizer", RUNTIME_OPTIMIZERS)
        self._choice("local_steps", LOCAL_STEPS)
        self._choice("outer_state", OUTER_STATES)
        self._flag("sync_moments")
        self._integer("moment_syncs", 1, optional=True)
        if self.moment_syncs is not None and not self.sync_moments:
            self._fail("moment_syncs", "says how many outer syncs carry the moments: it needs optim.sync_moments "
                                       "(--sync-moments)")
        self._choice("sync_landing", LANDINGS)
        self._choice("outer_sync", OUTER_SYNCS)
        if self.outer_sync != "sync" and self.sync_every is None:  # its pairs: runtime/composition.py
            self._fail("outer_sync", "is DiLoCo's: it needs optim.sync_every (--sync-every H)")
        if self.moment_syncs is not None and self.outer_sync != "sync":
            self._fail("moment_syncs", f"counts synchronous outer syncs: with optim.outer_sync {self.outer_sync} "
                                       f"every push carries the moments (geotrain.sync.async_moments)")
        self._choice("async_merge", ASYNC_MERGES)
        self._number("async_staleness_power", zero_ok=True)
        if self.async_merge != "staleness" and self.outer_sync == "sync":
            self._fail("async_merge", "is the asynchronous server's: it needs optim.outer_sync async or "
                                      "async-hierarchical (--outer-sync)")
        self._integer("sync_warmup", 0)
        self._number("lr", zero_ok=False)
        self._integer("onebit_warmup_steps", 1)
        self._number("clip_grad_norm", zero_ok=False, optional=True)
        self._integer("fragments", 1)
        self._choice("fragment_split", FRAGMENT_SPLITS)
        self._integer("sync_delay", 0)
        self._number("sync_mix", zero_ok=True)
        if self.sync_mix > 1:
            self._fail("sync_mix", "must be a number in [0, 1]")
        if self.sync_every is None:
            # (sync_delay without sync_every: delayed gradients)
            if self.local_steps != "equal":
                self._fail("local_steps", "shares an outer period's inner steps: it needs optim.sync_every (--sync-every H)")
            for key in ("fragments", "fragment_split", "sync_mix", "sync_landing", "sync_warmup", "sync_moments"):
                if getattr(self, key) != self.__dataclass_fields__[key].default:
                    self._fail(key, "is Streaming DiLoCo's: it needs optim.sync_every (--sync-every H)")
            if self.outer_state != "device":
                self._fail("outer_state", "is DiLoCo's outer state: it needs optim.sync_every (--sync-every H)")
            return
        try:
            check_outer_settings(self.sync_every, self.outer_lr, self.outer_momentum, section=self.SECTION)
        except OuterStepError as exc:
            raise RuntimeConfigError(str(exc)) from None
        if self.fragments > self.sync_every:
            self._fail("fragments", f"must be an integer in 1..{self.sync_every} (optim.sync_every)")
        if self.sync_delay > self.sync_every - 1:
            self._fail("sync_delay", f"must be an integer in 0..{self.sync_every - 1} (below optim.sync_every)")
        if self.sync_landing == "eager" and self.sync_mix != 0:
            self._fail("sync_mix", "is the mix landing's alpha; with optim.sync_landing eager it must be 0")
        # --sync-every with 1-bit Adam or --clip-grad-norm: rules of the composition table (runtime/composition.py)
