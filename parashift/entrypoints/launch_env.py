"""Where each host's launch flags come from: the command line first, then the variables a
launcher sets (torchrun's MASTER_ADDR, MASTER_PORT, NODE_RANK or GROUP_RANK, WORLD_SIZE
over LOCAL_WORLD_SIZE; one `parashift serve` per host, so LOCAL_RANK is 0), then the
engine's defaults."""
import os

# EngineConfig field -> the variables that give it, first found first
ENV_NAMES = {"master_addr": ("MASTER_ADDR",), "master_port": ("MASTER_PORT",),
             "node_rank": ("NODE_RANK", "GROUP_RANK")}


def launch_values(args, environ=os.environ) -> dict:
    """nnodes, node_rank, master_addr and master_port, for those any source gives."""
    if environ.get("LOCAL_RANK", "0") != "0":
        raise ValueError(f"LOCAL_RANK is {environ['LOCAL_RANK']}: run one parashift serve per "
                         "host (torchrun --nproc-per-node 1); it starts the host's ranks itself")
    values = {}
    for name, variables in ENV_NAMES.items():
        given = getattr(args, name, None)
        variable = next((v for v in variables if v in environ), None)
        if given is not None:
            values[name] = given
        elif variable is not None:
            text = environ[variable]
            values[name] = text if name == "master_addr" else _integer(variable, text)
    nnodes = getattr(args, "nnodes", None)
    if nnodes is None and "WORLD_SIZE" in environ:
        nnodes = _integer("WORLD_SIZE", environ["WORLD_SIZE"]) // _integer(
            "LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", "1"))
    if nnodes is not None:
        values["nnodes"] = nnodes
    return values


def _integer(name: str, value) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
