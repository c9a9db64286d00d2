"""Which link profile a node's GPUs are priced with: the committed NVLink profile of the
node's width (the default), the committed PCIe-like one ("pcie": NCCL through host memory,
as runs with NCCL_P2P_DISABLE=1 move their collectives), or a link profile's JSON file (one
`parashift profile` measured)."""
import re
from pathlib import Path

from parashift.cost.profile import LinkProfile, load

LINKS = {"nvlink": "", "pcie": "_pcie"}  # a link's name -> its committed files' infix


def committed_links(folder: Path, prefix: str, link: str = "nvlink") -> dict[int, Path]:
    """Ranks -> `folder`'s `<prefix>x<ranks><infix>_link.json` of `link`."""
    pattern = re.compile(rf"{re.escape(prefix)}x(\d+){LINKS[link]}_link\.json")
    found = (pattern.fullmatch(p.name) for p in sorted(folder.glob(f"{prefix}x*_link.json")))
    return {int(m.group(1)): folder / m.group(0) for m in found if m}


def choose_link(folder: Path, prefix: str, gpus_per_node: int,
                link: str = "nvlink") -> LinkProfile | None:
    """The link profile of `link` for `gpus_per_node` GPUs: the narrowest committed one that
    covers them, else the widest (collectives scaled by ring traffic); None for one GPU, or
    where no NVLink profile of `prefix` is committed."""
    if link not in LINKS:
        return _link_file(link)
    if gpus_per_node < 2:
        return None
    found = committed_links(folder, prefix, link)
    if not found:
        if link == "nvlink":
            return None
        raise ValueError(f"no {link} link profile of {prefix} in {folder}")
    wide = [ranks for ranks in found if ranks >= gpus_per_node]
    return load(found[min(wide)] if wide else found[max(found)])


def _link_file(spec: str) -> LinkProfile:
    path = Path(spec)
    if path.suffix != ".json" or not path.is_file():
        raise ValueError(f"unknown link profile {spec!r}: give one of {', '.join(LINKS)} or a "
                         "link profile's JSON file (`parashift profile --output FILE`)")
    profile = load(path)
    if not isinstance(profile, LinkProfile):
        raise ValueError(f"{spec}: a {profile.kind} profile, not a link profile")
    return profile
