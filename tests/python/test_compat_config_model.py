"""runtime.config_utils.DeepSpeedConfigModel: a class of one's own derived from it validates the
values it is given as DeepSpeed's pydantic model does (issue 55: before, it ignored them and
validated nothing), and zspeed's own sections stay its instances."""
import logging
from typing import List, Optional

import pytest

pydantic = pytest.importorskip("pydantic", minversion="2", reason="DeepSpeedConfigModel subclasses are pydantic models")
from pydantic import Field, ValidationError  # noqa: E402

from zspeed.runtime.config_utils import DeepSpeedConfigModel, get_config_default  # noqa: E402


class Inner(DeepSpeedConfigModel):
    c: int = 5


class Conf(DeepSpeedConfigModel):
    param_1: int = 0
    param_2_old: Optional[str] = Field(None, json_schema_extra={"deprecated": True, "new_param": "param_2",
                                                                "new_param_fn": lambda x: [x]})
    param_2: Optional[List[str]] = None
    param_3: int = Field(0, alias="param_3_alias")
    inner: Inner = Field(default_factory=Inner)
    old_c: Optional[int] = Field(None, json_schema_extra={"deprecated": True, "new_param": "inner.c"})
    kept_old: Optional[int] = Field(None, json_schema_extra={"deprecated": True, "new_param": "param_1",
                                                             "set_new_param": False, "deprecated_msg": "gone soon"})
    replace_method: str = "x"


def test_the_values_given_are_kept_and_validated():
    assert Conf(param_1=42).param_1 == 42
    assert Conf(**{"param_1": "7"}).param_1 == 7  # pydantic's lax mode, as DeepSpeed's
    for bad in ({"param_1": "DS"}, {"param_2": "DS"}, {"param_1_typo": 0}):
        with pytest.raises(ValidationError):
            Conf(**bad)
    c = Conf()
    with pytest.raises(ValidationError):
        c.param_1 = "not a number"  # validate_assignment
    c.param_1 = 3
    assert c.param_1 == 3


def test_alias_and_name_both_work():
    assert Conf(param_3=10).param_3 == 10 and Conf(param_3_alias=11).param_3 == 11


def test_auto_values_keep_the_default_unless_strict():
    assert Conf(param_1="auto").param_1 == 0
    assert Conf(replace_method="auto").replace_method == "auto"  # DeepSpeed's one exception
    with pytest.raises(ValidationError):
        Conf(strict=True, param_1="auto")


def test_deprecated_fields_move_to_their_replacement(caplog):
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        c = Conf(param_2_old="DS")
    assert c.param_2 == ["DS"] and not hasattr(c, "param_2_old")
    assert "param_2_old is deprecated use param_2 instead" in caplog.text
    assert Conf(old_c=9).inner.c == 9  # a dotted path into a nested section
    with caplog.at_level(logging.WARNING, logger="zspeed"):
        k = Conf(kept_old=4)
    assert k.kept_old == 4 and k.param_1 == 0 and "kept_old is deprecated use param_1 instead. gone soon" in caplog.text
    with pytest.raises(AssertionError, match="together"):
        Conf(param_2=["DS"], param_2_old="DS")


def test_zspeeds_sections_are_instances_and_defaults_are_read():
    from zspeed.runtime.precision_config import get_bfloat16_config
    from zspeed.runtime.zero.config import DeepSpeedZeroConfig
    for section in (DeepSpeedZeroConfig(stage=2), get_bfloat16_config({"bf16": {"enabled": True}})):
        assert isinstance(section, DeepSpeedConfigModel)
    assert issubclass(DeepSpeedZeroConfig, DeepSpeedConfigModel)
    assert not isinstance(object(), DeepSpeedConfigModel) and isinstance(Conf(), DeepSpeedConfigModel)
    assert not isinstance(Conf(), Inner)  # the metaclass answers only for the base
    assert get_config_default(Conf, "param_1") == 0 and get_config_default(Conf(), "param_3") == 0

    class Required(DeepSpeedConfigModel):
        r: int
    with pytest.raises(AssertionError, match="required"):
        get_config_default(Required, "r")
    with pytest.raises(AssertionError, match="not a field"):
        get_config_default(Conf, "nope")
