"""The (producer, consumer) pairs a model's modules declare for a fusion across two layers
(`fp8_input_pairs`, `norm_router_pairs`: a producer's attribute name and its consumer's
submodule path), for the passes that swap a producer for its fusing twin."""
from typing import Iterator

from torch import nn


def declared_pairs(model: nn.Module, attribute: str
                   ) -> Iterator[tuple[nn.Module, str, object, nn.Module]]:
    """(module, producer's name, producer, consumer) for each pair of `attribute` whose
    consumer exists (a mixture of experts' layer has no dense MLP to feed); a producer's name
    may be a submodule path (a pair across decoder layers), None where nothing is there."""
    for module in list(model.modules()):
        for producer_name, consumer_path in getattr(module, attribute, ()):
            try:
                consumer = module.get_submodule(consumer_path)
            except AttributeError:
                continue
            yield module, producer_name, _found(module, producer_name), consumer


def _found(module: nn.Module, path: str) -> object:
    try:
        return module.get_submodule(path) if "." in path else getattr(module, path)
    except AttributeError:
        return None
