"""`plan --codecs auto`: the placement searched for the policy's activation codec as well, the better one kept."""

import json

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import seed_geo
from geotrain.cost import build_cost_model
from geotrain.cost.codec_choice import choose_codecs, parse_codec_policy
from geotrain.job import GPT_13B_SEED


def _plan(capsys, *extra: str) -> dict:
    assert main(["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "--codecs", "auto", *extra,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_four_bit_activations_move_the_cuts_onto_slow_links_when_that_wins(capsys):
    plan = _plan(capsys, "--codec-policy", "dp=int8-block,pp=int4-block")
    tried = plan["codecs"]["placement"]["tried"]
    assert list(tried) == ["searched uncompressed", "searched for int4-block activations"]
    assert plan["codecs"]["placement"]["kept"] == "searched for int4-block activations"
    assert tried["searched for int4-block activations"] < 0.9 * tried["searched uncompressed"]
    # recomputed: the kept placement's codecs and totals, and its uncompressed cost, by the models themselves
    assignment = np.asarray(plan["assignment"])
    choice = choose_codecs(seed_geo(), GPT_13B_SEED, assignment, parse_codec_policy("dp=int8-block,pp=int4-block"))
    assert plan["codecs"]["cost"]["total"] == pytest.approx(choice.cost["total"], rel=1e-12)
    assert plan["codecs"]["cost"]["total"] == pytest.approx(tried["searched for int4-block activations"], rel=1e-12)
    model = build_cost_model("yuan", seed_geo(), GPT_13B_SEED, 4, 8)
    assert plan["cost"]["total"] == pytest.approx(model.evaluate(assignment).total, rel=1e-12)
    assert "gap" not in plan  # the exact search's certificate is for uncompressed bytes, another placement
    assert plan["explanation"][-1].startswith("Codecs: the placement searched for int4-block activations is kept")


def test_the_default_policy_sends_native_activation_bytes_so_it_searches_once(capsys):
    plan = _plan(capsys)
    assert plan["codecs"]["placement"]["tried"] == {"searched uncompressed": plan["codecs"]["cost"]["total"]}
    assert plan["gap"] == 0.0  # seed-geo is region-uniform: the uncompressed optimum, proven
