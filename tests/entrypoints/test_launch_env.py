"""Launch flags from the command line, else torchrun's variables."""
from types import SimpleNamespace

import pytest

from parashift.entrypoints.launch_env import launch_values


def _args(**given):
    names = ("nnodes", "node_rank", "master_addr", "master_port")
    return SimpleNamespace(**{name: given.get(name) for name in names})


def test_torchrun_variables_fill_what_the_flags_do_not_give():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "GROUP_RANK": "1",
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    assert launch_values(_args(), env) == {"master_addr": "10.0.0.1", "master_port": 29400,
                                           "node_rank": 1, "nnodes": 2}
    assert launch_values(_args(node_rank=0, master_port=1234), env)["node_rank"] == 0
    assert launch_values(_args(), {"NODE_RANK": "3", "GROUP_RANK": "1"})["node_rank"] == 3
    assert launch_values(_args(), {}) == {}


def test_one_serve_per_host_and_integers_only():
    with pytest.raises(ValueError, match="one parashift serve per host"):
        launch_values(_args(), {"LOCAL_RANK": "1"})
    with pytest.raises(ValueError, match="MASTER_PORT must be an integer"):
        launch_values(_args(), {"MASTER_PORT": "http"})
