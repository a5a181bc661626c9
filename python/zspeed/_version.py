__version__ = "0.1.0"
# A wheel built from a git checkout carries zspeed/_build_info.py with the commit (short hash)
# and branch it was built from, written by the build (cmake/zspeed_build_info.cmake), never
# into the sources; from the sources, or a wheel built elsewhere (an sdist), both are None.
try:
    from ._build_info import git_branch as __git_branch__, git_hash as __git_hash__
except ImportError:
    __git_hash__ = None
    __git_branch__ = None
