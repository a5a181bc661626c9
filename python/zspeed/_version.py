__version__ = "0.1.0"
# A wheel built from a git checkout carries zspeed/_build_info.py with the commit (short hash)
# and branch it was built from, written by the build (cmake/zspeed_build_info.cmake), never
# into the sources; from the sources, or a wheel built elsewhere (an sdist), both are None.
# Looked up by name: a module that only a built wheel has (no import statement to follow).


def _build_info():
    """(git hash, git branch) the wheel was built from, or (None, None)."""
    import importlib
    try:
        info = importlib.import_module(__name__.rpartition(".")[0] + "._build_info")
    except ImportError:
        return None, None
    return info.git_hash, info.git_branch


__git_hash__, __git_branch__ = _build_info()
del _build_info
