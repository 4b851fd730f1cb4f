"""Where the web app's files are: inside the installed package, or the checkout next to it.

A wheel ships the repository's ``app.py``, ``pages/``, ``ui/`` and ``.streamlit/config.toml``
under ``attnviz/_app/`` (pyproject.toml, force-include), so the app starts from an installed
package; an editable install or a plain checkout uses the files at the repository root.
Nothing here imports Streamlit.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..errors import AttnvizError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # attnviz/


def app_script() -> Path:
    """The app's entry script (``app.py``)."""
    shipped = PACKAGE_DIR / "_app" / "app.py"
    if shipped.is_file():
        return shipped
    checkout = PACKAGE_DIR.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "app.py").is_file():
        return checkout / "app.py"
    raise AttnvizError(
        f"the web app's files are missing from this installation ({shipped}); reinstall attnviz "
        "from a wheel or a checkout"
    )


def _flag_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def streamlit_flags(app_dir: Path) -> list[str]:
    """``app_dir/.streamlit/config.toml`` as ``--section.option=value`` flags (Streamlit reads
    config files only from the working folder and the home folder, not from the app's)."""
    config = app_dir / ".streamlit" / "config.toml"
    if not config.is_file():
        return []
    flags = []
    for section, options in tomllib.loads(config.read_text()).items():
        if isinstance(options, dict):
            flags += [
                f"--{section}.{k}={_flag_value(v)}" for k, v in options.items() if not isinstance(v, dict)
            ]
    return flags
