"""The poem studio: `python studio.py [ckpt_path=…] [port=8000] [host=127.0.0.1] [allowed_hosts=[…]]`, then
open the printed address. A page to write poems with every `sample.py` control, watch them stream in,
click a character for the attention of the step that drew it, regenerate a line, copy the poem
(model/studio/server.py; docs/studio.md). One process, no login, nothing from the network.
"""
from __future__ import annotations

import sys

import hydra
import rootutils
import uvicorn
from omegaconf import DictConfig

from model.cli import USER_ERRORS, exit_on_user_error, quote_non_ascii_overrides
from model.studio.server import LOOPBACK, create_app

rootutils.setup_root(__file__, indicator=".project-root")  # PROJECT_ROOT, which conf/paths reads


def serve(cfg: DictConfig) -> None:
    """Serve the studio at cfg.host:cfg.port until Ctrl-C; a missing checkpoint is reported, not fatal."""
    app = create_app(cfg.paths.checkpoint_dir, cfg.ckpt_path, cfg.device, cfg.backend, tuple(cfg.allowed_hosts),
                     tuple(cfg.allowed_folders), cfg.corpus_path)
    try:  # load the default checkpoint now, so that the first poem starts at once
        _, path = app.state.engine_for(None)
        print(f"checkpoint {path}")
    except USER_ERRORS as err:  # the page shows it too, until there is one
        print(f"error: {err}", file=sys.stderr)
    if cfg.host not in LOOPBACK:
        print(f"studio: host={cfg.host} listens beyond this machine, with no login: any client that reaches port "
              f"{cfg.port} and names it as one of {', '.join([*LOOPBACK, *cfg.allowed_hosts])} can write poems and read "
              f"the checkpoints under {cfg.paths.checkpoint_dir}; add the names other machines use with "
              "allowed_hosts=[…]", flush=True)
    address = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host  # what a browser here can open
    print(f"studio: http://{address}:{cfg.port}/  (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")


@hydra.main(version_base="1.3", config_path="conf", config_name="studio")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    serve(cfg)


if __name__ == "__main__":
    sys.argv = quote_non_ascii_overrides(sys.argv)
    main()
