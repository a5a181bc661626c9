"""DeepSpeed's ``deepspeed.runtime.zero.leaf_module_config``: the ``zero_optimization.leaf_module``
section (``classes``, ``names``, ``name_suffixes``: the modules ZeRO-3 gathers whole, see
zspeed.utils.z3_leaf_module) as a read-only object, and DeepSpeed's defaults."""
from __future__ import annotations

from ..config import DEFAULT_LEAF_MODULE_CLASSES as _CLASSES
from ..errors import validates_like_pydantic
from .offload_config import ReadOnlyConfig

__all__ = ["DeepSpeedZeroLeafModuleConfig", "DEFAULT_LEAF_MODULE_CLASSES", "DEFAULT_LEAF_MODULE_NAMES",
           "DEFAULT_LEAF_MODULE_NAME_SUFFIXES"]

DEFAULT_LEAF_MODULE_CLASSES = list(_CLASSES)
DEFAULT_LEAF_MODULE_NAMES: list = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: list = []


class DeepSpeedZeroLeafModuleConfig(ReadOnlyConfig):
    """A validated ``zero_optimization.leaf_module`` section: ``classes``, ``names`` and
    ``name_suffixes``, each a list of strings (a string alone is a list of one; duplicates are
    dropped), DeepSpeed's defaults where absent."""

    @validates_like_pydantic
    def __init__(self, **section):
        from ..config import parse_leaf_module
        super().__init__(**parse_leaf_module(section, set()))

    def __repr__(self) -> str:
        v = self.__dict__["_values"]
        return f"DeepSpeedZeroLeafModuleConfig(classes={v['classes']!r}, names={v['names']!r}, " \
               f"name_suffixes={v['name_suffixes']!r})"
