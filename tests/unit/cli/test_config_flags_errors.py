"""Errors name what the user wrote: a flag given as that flag, a --config file's key as its key, and a setting the
plan brought (its WAN recipe) as its flag with "set by the plan" (issue 50: a refusal named `--sync-delay 1`, and
another `optim.sync_every`, which only the plan had set)."""

import argparse

import pytest

from geotrain.cli.config_flags import errors_name_flags, setting_flags
from geotrain.runtime.sections import RuntimeConfigError

PLAN = ("plan.json", {"optim": {"sync_every": 2, "local_steps": "adaptive", "sync_delay": 1}})


def _raised(message: str, given: dict, plan=PLAN) -> str:
    with pytest.raises(RuntimeConfigError) as caught, errors_name_flags(argparse.Namespace(**given), plan):
        raise RuntimeConfigError(message)
    return str(caught.value)


def test_a_key_the_plan_set_is_its_flag_and_said_to_be_the_plans():
    assert _raised("optim.sync_delay must be an integer in 0..1 (below optim.sync_every), got 5",
                   {"sync_delay": 5}) == ("--sync-delay must be an integer in 0..1 (below --sync-every), got 5 "
                                          "(set by the plan plan.json: --sync-every 2)")


def test_a_flag_the_plan_set_is_said_to_be_the_plans_and_a_flag_given_is_not():
    message = "--outer-sync async with --local-steps adaptive: they cannot run together"
    assert _raised(message, {"outer_sync": "async"}) == f"{message} (set by the plan plan.json: --local-steps adaptive)"
    assert _raised(message, {"outer_sync": "async", "local_steps": "adaptive"},
                   ("plan.json", {"optim": {"sync_every": 2}})) == message


def test_without_a_plan_only_the_given_flags_are_renamed():
    assert _raised("run.steps must be an integer >= 1, got 0 (optim.sync_every)", {"steps": 0}, None) == \
        "--steps must be an integer >= 1, got 0 (optim.sync_every)"


def test_setting_flags_write_a_switch_alone_and_leave_out_settings_without_a_flag():
    assert setting_flags({"optim": {"sync_every": 4}, "emulation": {"emulate_gpu_speed": True},
                          "comm": {"dp_codecs": ("int8-block", "fp16")}}) == {
        "optim.sync_every": "--sync-every 4", "emulation.emulate_gpu_speed": "--emulate-gpu-speed"}
