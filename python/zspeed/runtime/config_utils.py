"""DeepSpeed's ``deepspeed.runtime.config_utils`` names that scripts and libraries import.

``DeepSpeedConfigModel`` is DeepSpeed's base of config section classes, and a pydantic (v2)
model there; scripts and libraries derive their own sections from it. Here too it is a pydantic
model with DeepSpeed's rules, so such a class validates the values it is given exactly as under
DeepSpeed:

* unknown keys are refused, values are validated when set and on assignment, enum fields hold
  their values, a field may be given by its name or its alias;
* ``"auto"`` values are dropped before validation (the field keeps its default) unless the
  class is built with ``strict=True`` (DeepSpeed keeps ``"auto"`` for a field named
  ``replace_method``, and so does this);
* a field declared with ``json_schema_extra={"deprecated": True, ...}`` that is given logs a
  deprecation warning; with ``"new_param": "name"`` (a dotted path reaches into a nested
  section) its value, through ``"new_param_fn"`` if given, moves to that field and the old one
  is removed, unless ``"set_new_param": False``; giving both the old and the new field is an
  error (a ConfigAssertionError, an AssertionError as DeepSpeed raises).

zspeed's own section classes (``runtime.zero.config.DeepSpeedZeroConfig``, the offload and
precision sections) are validated by zspeed's schema, not by pydantic; they count as instances
of ``DeepSpeedConfigModel`` (registered as virtual subclasses), as DeepSpeed's sections are.
Without pydantic (DeepSpeed requires it; zspeed does not), zspeed's sections work as before and
a class deriving from ``DeepSpeedConfigModel`` is refused when it is defined, naming the fix.
"""
from __future__ import annotations

import functools
from abc import ABCMeta

from ..utils.logging import logger
from .errors import ConfigAssertionError, ConfigError
from .zero.offload_config import ReadOnlyConfig

__all__ = ["DeepSpeedConfigModel", "get_config_default"]


def _pydantic():
    try:
        import pydantic
    except ImportError:
        return None
    return pydantic if int(str(pydantic.VERSION).split(".")[0]) >= 2 else None


def _move_deprecated(model) -> None:
    """DeepSpeed's handling of deprecated fields (the module docstring), on a built model."""
    for name, info in type(model).model_fields.items():
        extra = info.json_schema_extra
        if not isinstance(extra, dict) or not extra.get("deprecated", False) or name not in model.model_fields_set:
            continue
        new = extra.get("new_param", "")
        note = extra.get("deprecated_msg", "")
        logger.warning(f"Config parameter {name} is deprecated" + (f" use {new} instead" if new else "")
                       + (f". {note}" if note else ""))
        if not new or not extra.get("set_new_param", True):
            continue
        value = extra.get("new_param_fn", lambda x: x)(getattr(model, name))
        *path, last = new.split(".")
        target = functools.reduce(getattr, path, model)
        if last in target.model_fields_set:
            raise ConfigAssertionError(f"Cannot provide deprecated parameter '{name}' and replacing parameter "
                                       f"'{new}' together: give only '{new}'")
        delattr(model, name)
        setattr(target, last, value)


_pd = _pydantic()

if _pd is not None:
    class _Meta(type(_pd.BaseModel)):
        """pydantic's model metaclass, where zspeed's own sections are instances of the base (pydantic
        checks isinstance without ABC registration)."""

        def __instancecheck__(cls, obj):
            return (cls is _base() and isinstance(obj, ReadOnlyConfig)) or super().__instancecheck__(obj)

        def __subclasscheck__(cls, sub):
            return (cls is _base() and isinstance(sub, type) and issubclass(sub, ReadOnlyConfig)) or \
                super().__subclasscheck__(sub)

    def _base():
        """DeepSpeedConfigModel itself (defined below; None while it is being defined)."""
        return globals().get("DeepSpeedConfigModel")

    class DeepSpeedConfigModel(_pd.BaseModel, metaclass=_Meta):
        """DeepSpeed's base of config sections: a pydantic model with DeepSpeed's rules (the
        module docstring)."""

        model_config = _pd.ConfigDict(validate_default=True, validate_assignment=True, use_enum_values=True,
                                      populate_by_name=True, extra="forbid", arbitrary_types_allowed=True,
                                      protected_namespaces=())

        def __init__(self, strict: bool = False, **data):
            if not strict:
                data = {k: v for k, v in data.items() if k == "replace_method" or not (isinstance(v, str)
                                                                                      and v == "auto")}
            super().__init__(**data)
            _move_deprecated(self)

else:
    class DeepSpeedConfigModel(metaclass=ABCMeta):
        """DeepSpeed's base of config sections; without pydantic only zspeed's own sections are
        its instances (the module docstring)."""

        def __init_subclass__(cls, **kwargs):
            raise ConfigError(f"{cls.__name__} derives from DeepSpeedConfigModel, which is a pydantic model (as "
                              f"in DeepSpeed): install pydantic 2 (pip install 'pydantic>=2') to define config "
                              f"classes of your own.")

    DeepSpeedConfigModel.register(ReadOnlyConfig)  # zspeed's schema-checked sections are instances


def get_config_default(config, field_name: str):
    """The default of ``field_name`` in a DeepSpeedConfigModel class (or instance), as DeepSpeed's
    helper: an error for a field that is not there or has no default."""
    cls = config if isinstance(config, type) else type(config)
    fields = getattr(cls, "model_fields", None)
    if fields is None or field_name not in fields:
        raise ConfigAssertionError(f"'{field_name}' is not a field in {config}")
    if fields[field_name].is_required():
        raise ConfigAssertionError(f"'{field_name}' is a required field and does not have a default value")
    return fields[field_name].get_default()
