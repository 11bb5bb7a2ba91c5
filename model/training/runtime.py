"""Start-up decisions made from the machine rather than the config: precision (a rule), wandb mode,
the attention backend check, the run's unique name, validation interval in optimizer steps.
Kept apart so `train.py` only wires."""
from __future__ import annotations

import ctypes
import logging
import netrc
import os
import re
import secrets
import signal
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import torch
from hydra.experimental.callback import Callback
from hydra.utils import instantiate
from lightning.pytorch import Callback as LightningCallback
from omegaconf import DictConfig, OmegaConf, open_dict

from model.device import check_backend
from model.training.finetune import finetune_tag
from model.training.interruption import TrainingInterrupted

log = logging.getLogger(__name__)

RUN_NAME_ENV = "MINGYUE_RUN_NAME"
"""Environment variable that fixes `run_name`: train.py sets it for the processes that
Lightning starts for the other DDP ranks, so every rank has rank 0's name."""


def launch_id() -> str | None:
    """The id that every process of one `torchrun` or `srun` launch shares, as a folder-safe string,
    or None outside such a launch (or in a one-task Slurm step). torchrun: `--rdzv-id`
    (`TORCHELASTIC_RUN_ID`; of the UUID `--standalone` draws, its first 8 hex digits); with none
    given, on one node, the agent's host and process id. srun: the job and step id.
    raises ValueError for torchrun across nodes without `--rdzv-id` (nothing shared to name the run by)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        run_id = env["TORCHELASTIC_RUN_ID"]
        if run_id == "none":
            if env.get("LOCAL_WORLD_SIZE") != env.get("WORLD_SIZE"):
                raise ValueError("torchrun on several nodes without --rdzv-id: give every node the same "
                                 "--rdzv-id=<id>, so that all ranks name the run alike")
            run_id = f"{socket.gethostname()}-{os.getppid()}"
        elif re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", run_id):
            run_id = run_id[:8]
        return "torchrun-" + re.sub(r"[^\w.-]", "-", run_id)
    if "SLURM_STEP_ID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        return f"slurm-{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"
    return None


def die_with_launcher() -> None:
    """In a DDP rank (started by torchrun, srun or Lightning's rank 0: `launch_id` or
    `MINGYUE_RUN_NAME` set), asks Linux to send this process SIGTERM when the process that started it
    dies (prctl PR_SET_PDEATHSIG), so a rank never outlives a launcher killed by SIGKILL; its
    SIGTERM handling then stops it (`StopOnSignal`, within `STOP_GRACE` even when stalled). Exits
    with status 143 at once if that process has already gone. Nothing elsewhere (other systems, a
    process that is not a rank)."""
    if not sys.platform.startswith("linux") or not (launch_id() or os.environ.get(RUN_NAME_ENV)):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the request was made
        raise SystemExit(143)


def launch_rank() -> int:
    """This process's global rank in a `torchrun` or `srun` launch (`RANK`, `SLURM_PROCID`), else 0."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) if launch_id() else 0)


def unique_run_name(stamp: str, what: str) -> str:
    """`run_name` (conf/train.yaml: `${unique_run_name:<date>-<time>,<model>-<attention>-<tokenizer>}`):
    `<stamp>-<what>-<6 random hex digits>`, so runs started in the same second, or the jobs of a
    Hydra multirun, get folders of their own. Every process of one run gets the same name: the
    value of `MINGYUE_RUN_NAME` where it is set (a DDP rank started by rank 0, or set by hand), else
    `<what>-<launch id>` under torchrun or srun (`launch_id`: each process resolves its own config,
    at its own time). Registered with `use_cache`: one value per composed config."""
    if os.environ.get(RUN_NAME_ENV):
        return os.environ[RUN_NAME_ENV]
    launch = launch_id()
    return f"{what}-{launch}" if launch else f"{stamp}-{what}-{secrets.token_hex(3)}"


OmegaConf.register_new_resolver("unique_run_name", unique_run_name, use_cache=True, replace=True)
OmegaConf.register_new_resolver("finetune_tag", finetune_tag, replace=True)  # conf/experiment/finetune.yaml
OmegaConf.register_new_resolver(  # conf/hydra/default.yaml: the run's log file and config record are rank 0's
    "launch_rank_zero", lambda value, other=None: other if launch_rank() else value, replace=True)

def check_new_run_folder(checkpoint_dir: Path, run_name: str) -> None:
    """raises ValueError if `checkpoint_dir` already holds checkpoints, unless this process is
    a DDP rank of the run `run_name` (started by its rank 0): a new run never writes into
    another run's folder."""
    if os.environ.get(RUN_NAME_ENV) != run_name and any(checkpoint_dir.glob("*.ckpt")):
        raise ValueError(f"{checkpoint_dir} already holds checkpoints of another run; choose another run_name "
                         f"(to continue that run: ckpt_path={checkpoint_dir})")


class RefuseTakenRunName(Callback):
    """Hydra callback (conf/hydra/default.yaml) that refuses a `run_name` another run has used,
    in `on_run_start`: before Hydra writes the run's output folder (`.hydra/*.yaml`, `train.log`),
    so a refused run changes no byte of another run's checkpoints, logs or wandb files."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        """raises SystemExit `error: run_name=<name> is taken ...` (exit status 1) if
        `checkpoints/<run_name>` or `logs/<run_name>` exists, unless this process is a DDP rank
        of that run (started by its rank 0, which made the folders). Under torchrun or srun, where
        every rank starts at once and may make an empty `logs/<run_name>` before rank 0 looks,
        rank 0 looks for `logs/<run_name>/.hydra` (which only rank 0 writes) and the other ranks,
        which write nothing there, for `checkpoints/<run_name>` (which rank 0 makes only once
        every rank has joined)."""
        name = config.run_name
        if os.environ.get(RUN_NAME_ENV) == name:
            return
        checkpoints, logs = Path(config.paths.checkpoint_dir) / name, Path(config.hydra.run.dir)
        folders, launch = [checkpoints, logs], launch_id()
        if launch:
            folders = [checkpoints] if launch_rank() else [checkpoints, logs / ".hydra"]
        for folder in folders:
            if folder.exists():
                again = "launch again with another --rdzv-id (or run_name=)" if launch else "choose another run_name"
                resume = f", or continue that run with ckpt_path={checkpoints}" if any(checkpoints.glob("*.ckpt")) else ""
                raise SystemExit(f"error: run_name={name} is taken: {folder} exists (another run's record, left "
                                 f"unchanged); {again}{resume}")


class OneRunOnEveryRank(LightningCallback):
    """At `setup` of fitting, once every rank has joined the process group: raises ValueError on
    every rank if the ranks disagree on `run_name` or `trainer.precision` (each resolves its own
    config: another machine, another `MINGYUE_RUN_NAME`), naming each rank's value. Then rank 0
    says the global batch once, in a log line and as the loggers' hyperparameters `global_batch`
    (windows per optimizer step: `data.batch_size` × devices × nodes × accumulation) and
    `global_batch_tokens` (× `block_size`)."""

    def __init__(self, run_name: str):
        self.run_name = run_name

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        mine = {"run_name": self.run_name, "trainer.precision": str(trainer.precision)}
        every = [mine]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            every = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(every, mine)
        for key in mine:
            if len({r[key] for r in every}) > 1:
                raise ValueError(f"the ranks disagree on {key}: " + ", ".join(
                    f"rank {i} {r[key]}" for i, r in enumerate(every)) + f"; set {key} alike for every rank")
        if trainer.is_global_zero and len(every) > 1:
            log.info(f"{len(every)} ranks agree: run_name {self.run_name}, trainer.precision {trainer.precision}")
        dm, k = trainer.datamodule, trainer.accumulate_grad_batches
        windows = dm.batch_size * trainer.world_size * k
        if trainer.is_global_zero:
            devices, nodes = trainer.num_devices, trainer.num_nodes
            log.info(f"global batch: {windows} windows, {windows * dm.block_size} tokens per optimizer step "
                     f"(data.batch_size={dm.batch_size} × {devices} device{'s' * (devices != 1)} × {nodes} "
                     f"node{'s' * (nodes != 1)} × {k} accumulated)")
            for lg in trainer.loggers:
                lg.log_hyperparams({"global_batch": windows, "global_batch_tokens": windows * dm.block_size})


@contextmanager
def run_name_for_all_ranks(run_name: str) -> Iterator[None]:
    """Exports `MINGYUE_RUN_NAME=run_name` for the block (fitting): the processes Lightning
    starts there for the other DDP ranks inherit it and so resolve rank 0's `run_name`.
    Removed afterwards, unless it was set before (this process is such a rank)."""
    inherited = RUN_NAME_ENV in os.environ
    os.environ[RUN_NAME_ENV] = run_name
    try:
        yield
    finally:
        if not inherited:
            del os.environ[RUN_NAME_ENV]  # the next job of a multirun draws its own name


def several_processes(trainer_cfg: DictConfig) -> bool:
    """Whether Lightning will train this trainer config in several processes: a torchrun or srun
    launch, `num_nodes` > 1, more than one device asked for (an int or a list), or `devices: auto`
    (or -1) where the accelerator may be a GPU and there are several CUDA GPUs."""
    devices, accelerator = trainer_cfg.get("devices", "auto"), str(trainer_cfg.get("accelerator", "auto"))
    if launch_id() or int(trainer_cfg.get("num_nodes") or 1) > 1:
        return True
    if devices in ("auto", -1, "-1"):
        return accelerator in ("auto", "gpu", "cuda") and torch.cuda.device_count() > 1
    if isinstance(devices, str):
        devices = [d for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
    return (len(devices) if not isinstance(devices, int) else devices) > 1


def ddp_strategy(trainer_cfg: DictConfig, collective_timeout: float) -> None:
    """Under several processes (`several_processes`), a `strategy` of `auto` or `ddp` becomes
    Lightning's DDPStrategy, in place, with
    - `find_unused_parameters=True`: a parameter may take no part in one rank's step (the adaptive
      head scores only the clusters its batch's targets fall in; the rhyme loss needs a rhyme
      slot), and DDP's gradient all-reduces pair up only when every rank knows which did not, so
      the ranks would wait for each other for ever. A parameter no rank used keeps no gradient,
      as on one process; the cost per step: docs/benchmarks.md, "DDP step".
    - `timeout`: `collective_timeout` seconds, the process group's limit on any collective (torch's
      own is 30 minutes): a stalled rank, a dead peer or a lost node ends every rank after it.
    Any other strategy is left as it is. Under torchrun, `devices: auto` becomes torchrun's processes
    per node (`LOCAL_WORLD_SIZE`) and `num_nodes: 1` its nodes (`WORLD_SIZE` ÷ that), as Lightning
    requires of a launch it did not start: `torchrun --nproc-per-node=2 train.py` trains without
    `trainer=ddp` (nanoGPT's habit). raises ValueError for a timeout that is not positive."""
    if isinstance(collective_timeout, bool) or not isinstance(collective_timeout, (int, float)) \
            or not collective_timeout > 0:
        raise ValueError(f"collective_timeout={collective_timeout} must be a positive number of seconds")
    per_node, world = (int(os.environ.get(k, 0)) for k in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"))
    with open_dict(trainer_cfg):  # the default trainer config has no `strategy` key, and is a struct
        if per_node and str(trainer_cfg.get("devices", "auto")) in ("auto", "-1"):
            trainer_cfg.devices = per_node
            if int(trainer_cfg.get("num_nodes") or 1) == 1 and world > per_node:
                trainer_cfg.num_nodes = world // per_node
        if str(trainer_cfg.get("strategy", "auto")) not in ("auto", "ddp") or not several_processes(trainer_cfg):
            return
        trainer_cfg.strategy = {"_target_": "lightning.pytorch.strategies.DDPStrategy", "find_unused_parameters": True,
                                "timeout": {"_target_": "datetime.timedelta", "seconds": float(collective_timeout)}}


def end_process_group() -> None:
    """After a run that ended well, or that every rank stopped after the same step on a signal
    (`TrainingInterrupted`), destroys torch.distributed's default process group (if there is one)
    while the interpreter is still whole. Lightning does so only for NCCL; a gloo group
    left to the interpreter's exit aborts a rank that has finished (SIGABRT, "terminate called
    without an active exception") when one of gloo's worker threads lets go of its last tensor
    during finalization: a race right after the last collective (pytorch/pytorch#190489). Not
    called after a failure (or a SIGTERM before training began): destroying a group while another
    rank waits in a collective can hang."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@contextmanager
def process_group(trainer_cfg: DictConfig, collective_timeout: float) -> Iterator[None]:
    """The run's process group, set up and ended in one place: on entering, the trainer's strategy
    for several processes (`ddp_strategy`, in place; Lightning creates the group in `fit`); on
    leaving after a run that ended well, or that every rank stopped on a signal
    (`TrainingInterrupted`), `end_process_group`; after any other exception the group is left as
    it is (`end_process_group` says why)."""
    ddp_strategy(trainer_cfg, collective_timeout)
    try:
        yield
    except TrainingInterrupted:
        end_process_group()
        raise
    end_process_group()


def resolve_precision(precision: str, accelerator: str) -> str:
    """'auto' → 'bf16-mixed' where a CUDA GPU supports bfloat16 (and the accelerator allows a
    GPU), else '32-true': a rule, so every run and every rank on a machine gets the same choice,
    said in one log line (on the CPU bfloat16 autocast never made the default run faster, even
    with bfloat16 units: docs/training.md, "Precision"). Half precision the device cannot train in is converted,
    with a log line: with float16 weights (`16-true`) AdamW's eps (1e-8) rounds to 0, so a
    weight whose gradient is 0 (the embedding row of a token not in the batch) gets 0/0 = NaN
    at the first step: `16-mixed` on a GPU (float32 weights, scaled float16 compute); on the
    CPU, where Lightning has no float16 autocast, `16-true` and `16-mixed` become `bf16-mixed`
    (as Lightning itself does for `16-mixed`). Any other value is returned unchanged."""
    precision = str(precision)
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    if precision == "auto":
        choice = "bf16-mixed" if on_gpu and torch.cuda.is_bf16_supported() else "32-true"
        why = "a CUDA GPU with bfloat16" if choice != "32-true" else "a GPU without bfloat16" if on_gpu else "the CPU"
        log.info(f"trainer.precision=auto: {choice} ({why}; set trainer.precision to choose)")
        return choice
    if on_gpu:
        converted = "16-mixed" if precision == "16-true" else None
    else:
        converted = "bf16-mixed" if precision in ("16-true", "16-mixed", "16") else None
    if converted:
        log.warning(f"trainer.precision={precision} cannot train on {'a GPU' if on_gpu else 'the CPU'} "
                    f"({'AdamW on float16 weights gives NaN' if precision == '16-true' else 'no float16 autocast'}): "
                    f"using trainer.precision={converted}")
        return converted
    return precision


def check_accelerator(accelerator: str) -> None:
    """raises ValueError for a GPU accelerator (`gpu`, `cuda`) on a machine without a CUDA GPU,
    before Lightning's own multi-line error and before any data work."""
    if str(accelerator) in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(f"trainer.accelerator={accelerator} but there is no CUDA GPU here; on the CPU add "
                         "trainer.accelerator=cpu")


def val_check_in_batches(trainer_cfg: DictConfig) -> None:
    """`trainer.val_check_interval` (an int) counts optimizer steps; Lightning counts batches, so
    under `accumulate_grad_batches=k` it is multiplied by k in place, with a log line. An interval
    past `trainer.max_steps` becomes max_steps (a short run still ends with a validation and a
    `val/bpc`), with a log line. A float (a fraction of an epoch) is left alone."""
    k = trainer_cfg.get("accumulate_grad_batches", 1)
    interval, max_steps = trainer_cfg.get("val_check_interval"), trainer_cfg.get("max_steps") or -1
    if isinstance(interval, int) and 0 < max_steps < interval:
        log.info(f"validation at the last step: trainer.val_check_interval={interval} is past "
                 f"trainer.max_steps={max_steps}")
        trainer_cfg.val_check_interval = interval = max_steps
    if k > 1 and isinstance(interval, int):
        trainer_cfg.val_check_interval = interval * k
        log.info(f"validation every {interval} optimizer steps = every {interval * k} batches "
                 f"(trainer.accumulate_grad_batches={k})")


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype attention runs in under a Lightning precision string ('bf16-mixed' → bfloat16)."""
    if "bf16" in precision:
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float32


def wandb_logged_in() -> bool:
    """True when wandb has credentials here (WANDB_API_KEY or a netrc entry for its host).
    Reads local files only: never prompts and never touches the network."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def instantiate_loggers(cfg: DictConfig | None) -> list:
    """Loggers from the `logger` config group. A logger with `offline: auto` runs online
    when wandb has credentials and offline otherwise (WANDB_MODE, if set, wins)."""
    loggers = []
    for lg_cfg in (cfg or {}).values():
        if lg_cfg is None:
            continue
        if lg_cfg.get("offline") == "auto":
            with open_dict(lg_cfg):
                lg_cfg.offline = os.environ.get("WANDB_MODE", "") == "offline" or not wandb_logged_in()
        loggers.append(instantiate(lg_cfg))
    return loggers


def check_attention_backend(trainer, backend: str, dropout: float, d_k: int) -> None:
    """Raise BackendUnavailableError now, before any data or training work, if `backend`
    cannot run on the trainer's device in its precision with this dropout."""
    device_type = trainer.strategy.root_device.type
    check_backend(backend, device_type, compute_dtype(str(trainer.precision)), dropout, d_k)



def compile_or_eager(module: torch.nn.Module, log=print) -> bool:
    """Compile `module` in place with `torch.compile` (`nn.Module.compile`: the state_dict keys stay
    the eager ones, so checkpoints are interchangeable) if a trial compilation works here;
    otherwise keep it eager and say why through `log`. Returns whether it was compiled."""
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(2))  # needs a C++ compiler for the CPU backend
    except Exception as err:  # noqa: BLE001 — any failure of the toolchain means: stay eager
        log(f"compile: unavailable here ({type(err).__name__}: {str(err).splitlines()[0][:200]}); running eagerly")
        return False
    module.compile()
    log("compile: the model runs through torch.compile")
    return True
