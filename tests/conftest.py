import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).parent))

import tiny

tiny.register()  # `tiny:<arch>` specs for the app tests, through the engine's plugin hook


def _no_exec(*args, **kwargs):
    raise RuntimeError("a test tried to replace the pytest process (os.exec*): mock it")


# `attnviz app` execs Streamlit; a test that reached a real exec would replace pytest itself and
# end the run early with exit status 0. Make that a loud failure instead.
for _name in ("execv", "execve", "execvp", "execvpe", "execl", "execle", "execlp", "execlpe"):
    setattr(os, _name, _no_exec)
