"""Issue 12, item 5: one run, one folder, one name on every rank."""
import os
import re
import socket
import subprocess
import sys

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import train as train_script
from model.training.runtime import RUN_NAME_ENV
from tests.conftest import ROOT, tiny_overrides

NAME = re.compile(r"\d{8}-\d{6}-tiny-sdpa-char-[0-9a-f]{6}")


def compose_train(*overrides):
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        return compose("train", return_hydra_config=True, overrides=list(overrides))


def test_runs_composed_together_get_their_own_name_used_everywhere(monkeypatch):
    monkeypatch.delenv(RUN_NAME_ENV, raising=False)
    first, second = compose_train(), compose_train()
    assert NAME.fullmatch(first.run_name) and first.run_name != second.run_name
    for cfg in (first, second):  # one value per config, wherever it is used
        assert cfg.callbacks.model_checkpoint.dirpath.endswith(f"/checkpoints/{cfg.run_name}")
        assert cfg.logger.wandb.name == cfg.run_name
        assert cfg.hydra.run.dir.endswith(f"/logs/{cfg.run_name}")
        assert cfg.hydra.sweep.subdir == cfg.run_name


def test_a_ddp_rank_takes_the_run_name_of_rank_zero(train_cfg, monkeypatch):
    monkeypatch.setenv(RUN_NAME_ENV, "20261129-140540-tiny-sdpa-char-0a1b2c")  # what rank 0 exports
    assert compose_train().run_name == "20261129-140540-tiny-sdpa-char-0a1b2c"
    monkeypatch.delenv(RUN_NAME_ENV)
    seen = []
    monkeypatch.setattr(L.Trainer, "fit", lambda *args, **kwargs: seen.append(os.environ.get(RUN_NAME_ENV)))
    cfg = train_cfg("logger=none")
    train_script.train(cfg)
    assert seen == [cfg.run_name]  # exported while Lightning starts the other ranks
    assert RUN_NAME_ENV not in os.environ  # and not left for the next run of a multirun


def test_a_new_run_never_writes_into_an_existing_run_folder(train_cfg, tmp_path):
    (tmp_path / "checkpoints" / "test").mkdir(parents=True)
    (tmp_path / "checkpoints" / "test" / "last.ckpt").write_bytes(b"another run's")
    with pytest.raises(ValueError, match="checkpoints/test already holds checkpoints of another run; "
                                         "choose another run_name"):
        train_script.train(train_cfg("logger=none"))
    assert (tmp_path / "checkpoints" / "test" / "last.ckpt").read_bytes() == b"another run's"
    assert not (tmp_path / "cache").exists()


QUICK = ["trainer.max_steps=2", "trainer.val_check_interval=2", "logger=none", "~callbacks.samples",
         "~callbacks.attention_maps"]


@pytest.mark.slow
def test_runs_launched_together_and_multirun_jobs_get_folders_of_their_own(tiny_corpus, tmp_path):
    """The issue's shell loop (two runs started in the same second) beside a two-job multirun."""
    cmd = [sys.executable, str(ROOT / "train.py"), *tiny_overrides(tmp_path, tiny_corpus), *QUICK]
    env = {k: v for k, v in os.environ.items() if k != RUN_NAME_ENV}
    procs = [subprocess.Popen([*cmd, "model.optim.lr=1e-3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True),
             subprocess.Popen([*cmd, "model.optim.lr=2e-3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True),
             subprocess.Popen([*cmd[:2], "-m", *cmd[2:], "model.optim.lr=3e-3,4e-3"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out
    runs = sorted((tmp_path / "checkpoints").iterdir())
    assert len(runs) == 4 and all(NAME.fullmatch(run.name) for run in runs)
    assert all(sorted(p.name for p in run.glob("last*.ckpt")) == ["last.ckpt"] for run in runs)
    configs = sorted((tmp_path / "logs").glob("**/.hydra/config.yaml"))
    assert sorted(p.parent.parent.name for p in configs) == [run.name for run in runs]
    lrs = {float(re.search(r"lr: (\S+)", p.read_text())[1]) for p in configs}
    assert lrs == {1e-3, 2e-3, 3e-3, 4e-3}


@pytest.mark.slow
def test_every_ddp_rank_has_the_same_run_name(tiny_corpus, tmp_path):
    """Two CPU processes under DDP: rank 1 is started by Lightning and resolves the config again."""
    cmd = [sys.executable, str(ROOT / "train.py"), *tiny_overrides(tmp_path, tiny_corpus), *QUICK,
           "trainer.devices=2", "+trainer.strategy=ddp"]
    env = {k: v for k, v in os.environ.items() if k != RUN_NAME_ENV}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "checkpoints").iterdir()
    logs = {p.name: p.read_text() for p in (tmp_path / "logs" / run.name).glob("*.log")}
    assert set(logs) == {"train.log", "train_ddp_process_1.log"}  # rank 0, rank 1
    assert all(f"run_name {run.name}: checkpoints in {run}" in text for text in logs.values())


def folder_hashes(*folders):
    """{path: sha256} of every file under `folders`."""
    import hashlib
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for f in folders for p in sorted(f.rglob("*")) if p.is_file()}


def another_runs_folders(tmp_path, with_checkpoints=True):
    """The folders a run named `first` leaves: checkpoints, Hydra's record, its log and wandb files."""
    ckpt, logs = tmp_path / "checkpoints" / "first", tmp_path / "logs" / "first"
    for path, text in {logs / ".hydra" / "config.yaml": "model:\n  n_layer: 4\n", logs / ".hydra" / "overrides.yaml": "[]\n",
                       logs / ".hydra" / "hydra.yaml": "hydra: {}\n", logs / "train.log": "step 1\n",
                       logs / "wandb" / "offline-run-x" / "run-x.wandb": "records"}.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if with_checkpoints:
        ckpt.mkdir(parents=True)
        (ckpt / "last.ckpt").write_bytes(b"weights")
    return ckpt, logs


@pytest.mark.parametrize("with_checkpoints", [True, False], ids=["checkpoints and logs", "logs only"])
def test_a_refused_run_changes_no_byte_of_the_run_it_collided_with(tiny_corpus, tmp_path, with_checkpoints):
    ckpt, logs = another_runs_folders(tmp_path, with_checkpoints)
    before = folder_hashes(ckpt, logs)
    env = {k: v for k, v in os.environ.items() if k != RUN_NAME_ENV}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *tiny_overrides(tmp_path, tiny_corpus), *QUICK,
                           "run_name=first", "model.n_layer=1"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    taken = ckpt if with_checkpoints else logs
    resume = f", or continue that run with ckpt_path={ckpt}" if with_checkpoints else ""  # only if it can be
    assert proc.stderr.strip().splitlines() == [
        f"error: run_name=first is taken: {taken} exists (another run's record, left unchanged); choose another "
        f"run_name{resume}"]
    assert folder_hashes(ckpt, logs) == before and len(before) == 5 + with_checkpoints
    assert {p.name for p in tmp_path.iterdir()} == {"corpus", "logs"} | ({"checkpoints"} if with_checkpoints else set())


LAUNCH_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK", "SLURM_STEP_ID", "SLURM_NTASKS",
              "SLURM_JOB_ID", "SLURM_PROCID")


@pytest.fixture
def launch(monkeypatch):
    """Sets the environment of one process of a torchrun or srun launch (nothing else of one)."""
    for key in (*LAUNCH_ENV, RUN_NAME_ENV):
        monkeypatch.delenv(key, raising=False)
    return lambda **env: [monkeypatch.setenv(k, str(v)) for k, v in env.items()]


def test_every_process_of_a_launch_names_the_run_after_the_launch(launch):
    from model.training.runtime import launch_id
    assert launch_id() is None and NAME.fullmatch(compose_train().run_name)
    launch(TORCHELASTIC_RUN_ID="job7", LOCAL_WORLD_SIZE=2, WORLD_SIZE=4, RANK=3)
    assert launch_id() == "torchrun-job7"
    cfg = compose_train()
    assert cfg.run_name == "tiny-sdpa-char-torchrun-job7"
    assert cfg.hydra.output_subdir is None  # rank 3 leaves the config record, and train.log, to rank 0
    handlers = OmegaConf.to_container(cfg.hydra.job_logging, resolve=False)["handlers"]
    log_file = OmegaConf.create({"f": handlers["file"]["filename"].replace(
        "${hydra.runtime.output_dir}/${hydra.job.name}", "logs/x/train")})
    assert log_file.f == "/dev/null"  # its log: the console only
    launch(RANK=0)
    assert log_file.f == "logs/x/train.log"
    launch(RANK=3)
    launch(TORCHELASTIC_RUN_ID="16870951-787a-4f18-b6bc-b95c0b6dc080")  # --standalone's UUID
    assert launch_id() == "torchrun-16870951"
    launch(TORCHELASTIC_RUN_ID="none", RANK=0)
    with pytest.raises(ValueError, match="^torchrun on several nodes without --rdzv-id: give every node the same"):
        launch_id()
    launch(LOCAL_WORLD_SIZE=4)  # one node: its agent's host and process id
    assert launch_id() == f"torchrun-{socket.gethostname()}-{os.getppid()}"
    assert compose_train().hydra.output_subdir == ".hydra"


def test_an_srun_step_of_several_tasks_is_a_launch_and_one_task_is_not(launch):
    from model.training.runtime import launch_id, launch_rank
    launch(SLURM_JOB_ID=812, SLURM_STEP_ID=0, SLURM_NTASKS=1, SLURM_PROCID=0)
    assert launch_id() is None
    launch(SLURM_NTASKS=8, SLURM_PROCID=5)
    assert (launch_id(), launch_rank()) == ("slurm-812.0", 5)


def test_under_a_launch_rank_zero_refuses_another_runs_record_and_no_rank_refuses_its_own_log_folder(launch, tmp_path):
    from model.training.runtime import RefuseTakenRunName
    launch(TORCHELASTIC_RUN_ID="job7", LOCAL_WORLD_SIZE=2, WORLD_SIZE=2, RANK=0)
    cfg = compose_train(f"paths.checkpoint_dir={tmp_path / 'checkpoints'}", f"paths.log_dir={tmp_path / 'logs'}")
    logs = tmp_path / "logs" / cfg.run_name
    logs.mkdir(parents=True)  # made by another rank of this launch, already
    for rank in (0, 1):
        launch(RANK=rank)
        RefuseTakenRunName().on_run_start(cfg)
    (logs / ".hydra").mkdir()  # an earlier launch's rank 0 record
    with pytest.raises(SystemExit, match=r"is taken: .*/\.hydra exists"):
        launch(RANK=0)
        RefuseTakenRunName().on_run_start(cfg)
    (tmp_path / "checkpoints" / cfg.run_name).mkdir(parents=True)
    with pytest.raises(SystemExit, match=f"is taken: {tmp_path / 'checkpoints' / cfg.run_name} exists"):
        launch(RANK=1)
        RefuseTakenRunName().on_run_start(cfg)
