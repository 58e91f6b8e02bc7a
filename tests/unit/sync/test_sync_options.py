"""SyncOptions composes its sections (exchange, outer step, streaming, heterogeneity): flat names land in their
section, each section refuses its own bad field in one line naming it, and every field a combination error
names maps to the runtime config key it comes from."""

from dataclasses import fields
from operator import attrgetter

import pytest

from geotrain.runtime.config import SYNC_OPTION_KEYS, section_types
from geotrain.sync import (ExchangeOptions, HeterogeneityOptions, OuterOptions, StreamingOptions, SyncError,
                           SyncOptions)
from geotrain.sync.options import SECTIONS


def test_flat_names_land_in_their_sections():
    options = SyncOptions.of(codec="int8-block", optimizer="adamw", lr=0.01, total_steps=9, sync_every=4,
                             fragments=2, delay=1, mix=0.5, error_feedback=False, local_steps="equal")
    assert options.exchange == ExchangeOptions("int8-block", error_feedback=False)
    assert options.outer == OuterOptions(sync_every=4)
    assert options.streaming == StreamingOptions(fragments=2, delay=1, mix=0.5)
    assert options.heterogeneity == HeterogeneityOptions()
    with pytest.raises(SyncError, match=r"^SyncOptions.of: unknown option\(s\) fragment, sync_evry$"):
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, sync_evry=4, fragment=2)


def test_section_field_names_are_unique_so_flat_names_are_unambiguous():
    names = [f.name for section in SECTIONS.values() for f in fields(section)]
    names += [f.name for f in fields(SyncOptions) if f.name not in SECTIONS]
    assert len(names) == len(set(names)) == 3 + 6 + 6 + 5 + 5


@pytest.mark.parametrize("build, message", [
    (lambda: ExchangeOptions("none", hierarchical=1), "ExchangeOptions.hierarchical must be true or false, got 1"),
    (lambda: OuterOptions(sync_every=0), "OuterOptions: sync_every must be an integer >= 1, got 0"),
    (lambda: OuterOptions(sync_every=4, moment_syncs=2), "OuterOptions: moment_syncs says how many outer syncs"),
    (lambda: OuterOptions(sync_every=4, outer_state="disk"),
     "OuterOptions.outer_state must be one of device, host, got 'disk'"),
    (lambda: OuterOptions(outer_state="host"), "OuterOptions: outer_state says where DiLoCo's outer state lives"),
    (lambda: StreamingOptions(mix=1.5), "StreamingOptions.mix must be a number in [0, 1], got 1.5"),
    (lambda: StreamingOptions(fragments=2.0), "StreamingOptions.fragments must be an integer, got 2.0"),
    (lambda: HeterogeneityOptions(local_steps="fast"),
     "HeterogeneityOptions.local_steps must be one of equal, adaptive, got 'fast'"),
    (lambda: HeterogeneityOptions(outer_sync="later"),
     "HeterogeneityOptions.outer_sync must be one of sync, async, async-hierarchical, got 'later'"),
    (lambda: HeterogeneityOptions(async_merge="median"),
     "HeterogeneityOptions.async_merge must be one of staleness, heloco, got 'median'"),
    (lambda: HeterogeneityOptions(async_staleness_power=-0.5),
     "HeterogeneityOptions.async_staleness_power must be a finite number >= 0, got -0.5"),
    (lambda: HeterogeneityOptions(local_steps_prior_s=(1.0, 0.0)),
     "HeterogeneityOptions.local_steps_prior_s must be a tuple of finite seconds > 0"),
    (lambda: SyncOptions(ExchangeOptions("none"), "adamw", 0.01, 9, outer={"sync_every": 4}),
     "SyncOptions.outer must be an instance of OuterOptions, got {'sync_every': 4}"),
    (lambda: SyncOptions(ExchangeOptions("none"), "adamw", 0.01, 9, outer=OuterOptions(sync_every=4),
                         streaming=StreamingOptions(fragments=5)),
     "StreamingOptions.fragments must be an integer in 1..4 (sync_every 4), got 5"),
])
def test_each_section_refuses_its_own_bad_field_in_one_line(build, message):
    with pytest.raises(SyncError) as info:
        build()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_combination_error_names_dotted_fields_that_map_to_runtime_config_keys():
    with pytest.raises(SyncError) as info:
        SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9, fragments=2)
    assert info.value.fields == ("streaming.fragments", "streaming.fragment_split", "streaming.mix",
                                 "streaming.landing", "streaming.warmup", "outer.sync_every")
    options = SyncOptions.of(codec="none", optimizer="adamw", lr=0.01, total_steps=9)
    config_keys = {f"{section.SECTION}.{f.name}" for section in section_types() for f in fields(section)}
    for field, key in SYNC_OPTION_KEYS.items():
        attrgetter(field)(options)  # a field SyncOptions has
        assert key in config_keys, key
    assert set(info.value.fields) <= SYNC_OPTION_KEYS.keys()
