"""The train table says what its seconds are: wall seconds with links emulated at the time scale, and, under
--emulate-gpu-speed, compute in emulated seconds at each GPU's speed (issue 50: a T4 run's table read iteration
0.715 beside compute 1.317 with one word, "seconds", for both)."""

from geotrain.cli.train_cmd import table_units


def test_the_units_name_the_time_scale_and_the_emulated_compute():
    assert table_units(0.0, False) == "seconds"
    assert table_units(0.01, False) == "wall seconds, links emulated at --time-scale 0.01"
    assert table_units(1.0, True) == ("wall seconds, links emulated at --time-scale 1; compute: emulated seconds at "
                                      "each GPU's speed")
