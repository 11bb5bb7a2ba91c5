"""Sample poems from a checkpoint: `python sample.py ckpt_path=checkpoints/<run>/last.ckpt`.

Options (conf/sample.yaml): prompt, num_samples, max_new_tokens, temperature, top_k, seed,
device, backend, format. The same seed and options give the same poems.
"""
from __future__ import annotations

import sys
import json
from pathlib import Path

import hydra
import rootutils
import torch
from omegaconf import DictConfig

rootutils.setup_root(__file__, indicator=".project-root", pythonpath=True)

from data.poetry import LINE_END  # noqa: E402
from data.script import prompt_to_script  # noqa: E402
from model.lit import latest_checkpoint, load_for_inference  # noqa: E402
from model.attention import check_backend  # noqa: E402
from model.runtime import exit_on_user_error, quote_non_ascii_overrides  # noqa: E402


def as_lines(poem: str) -> str:
    """Break a poem after each sentence-final mark (。？！；), one couplet per line."""
    for mark in LINE_END[1:]:
        poem = poem.replace(mark, mark + "\n")
    return poem.strip()


def sample(cfg: DictConfig) -> list[str]:
    """Generate `cfg.num_samples` poems; returns them as plain text (no line breaks added).

    raises FileNotFoundError (no checkpoint), UnknownCharactersError (prompt characters outside
    the vocabulary), BackendUnavailableError, ValueError (bad temperature / top_k).
    """
    if cfg.temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {cfg.temperature}")
    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    ckpt = Path(cfg.ckpt_path) if cfg.ckpt_path else latest_checkpoint(Path(cfg.paths.checkpoint_dir))
    lit = load_for_inference(ckpt, device, cfg.backend)
    gpt, tok = lit.gpt, lit.tokenizer
    check_backend(gpt.cfg.attention, torch.device(device).type, torch.float32, 0.0, gpt.cfg.n_embd // gpt.cfg.n_head)  # eval: no dropout
    prompt = prompt_to_script(cfg.prompt, lit.hparams.script)
    ids = tok.encode(prompt, bos=True)  # raises, listing unknown characters, before any generation
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    start = torch.tensor([ids] * cfg.num_samples, device=device)  # (num_samples, T0)
    out = gpt.generate(start, cfg.max_new_tokens, cfg.temperature, cfg.top_k, eos_id=tok.eos_id, generator=gen)
    return [tok.decode(row.tolist()) for row in out]


@hydra.main(version_base="1.3", config_path="conf", config_name="sample")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    poems = sample(cfg)
    for poem in poems:
        if cfg.format == "jsonl":
            settings = {k: cfg[k] for k in ("ckpt_path", "prompt", "temperature", "top_k", "seed", "max_new_tokens")}
            print(json.dumps({"poem": poem, **settings}, ensure_ascii=False))
        else:
            print(as_lines(poem), end="\n\n")


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
