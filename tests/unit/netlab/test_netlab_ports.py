"""netlab.ports: how a process sees its interface's carrier (the partition test sets a lab port down: root)."""

from __future__ import annotations

import pytest

from geotrain.netlab.ports import has_carrier
from geotrain.netlab.topology import NetLabError


def test_the_loopback_has_a_carrier_and_an_unknown_interface_is_one_line():
    assert has_carrier("lo") is True
    with pytest.raises(NetLabError) as caught:
        has_carrier("gt-nonesuch")
    assert "'gt-nonesuch' not found" in str(caught.value) and "\n" not in str(caught.value)
