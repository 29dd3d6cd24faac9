"""Whether exact counting is installed: islpy with barvinok (``islpy-barvinok``, GPL-2), the optional extra
``tenet`` (docs/tenet.md, "Licence"). Without it, the stored closed forms still cost the presets' MMEs."""

from __future__ import annotations

PACKAGE = "islpy-barvinok"
INSTALL = 'pip install "tvm-dsa[tenet]"'


def missing() -> str | None:
    """None if islpy with barvinok's counting imports, else what is missing, for a message."""
    try:
        import islpy
    except ImportError:
        return f"{PACKAGE} is not installed"
    if not hasattr(islpy.Set, "card"):
        return f"islpy is installed without barvinok ({PACKAGE})"
    return None
