__version__ = "0.1.0"
__git_hash__ = None    # a release is not tied to a git checkout
__git_branch__ = None
