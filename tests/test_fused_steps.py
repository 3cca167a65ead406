"""Importing torch_tcsparse makes a fused optimizer step move its parameters' version counters,
as a plain or foreach step does (``torch_tcsparse.fused_steps``): a matrix holding a parameter's
``.detach()`` then rebuilds what it derived from the old values (tests/test_optimizers.py checks
the products)."""
import pytest
import torch

import torch_tcsparse  # noqa: F401 - installs the hook
from torch_tcsparse import fused_steps

OPTIMIZERS = [torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD]


def stepped(optimizer_class, parameters, **options):
    try:
        optimizer = optimizer_class(parameters, lr=0.1, **options)
    except (RuntimeError, ValueError) as error:  # fused kernels exist for some devices and dtypes only
        pytest.skip(f"{optimizer_class.__name__} {options}: {error}")
    for parameter in parameters:
        parameter.grad = torch.rand_like(parameter)
    return optimizer


@pytest.mark.parametrize("optimizer_class", OPTIMIZERS, ids=lambda c: c.__name__)
def test_a_fused_step_moves_the_version_counter_of_its_parameters_and_their_aliases(optimizer_class):
    parameter = torch.nn.Parameter(torch.rand(16))
    alias = parameter.detach()
    before = alias._version
    stepped(optimizer_class, [parameter], fused=True).step()
    assert parameter._version > before and alias._version == parameter._version


def test_only_fused_groups_are_marked():
    fused, plain = torch.nn.Parameter(torch.rand(8)), torch.nn.Parameter(torch.rand(8))
    optimizer = stepped(torch.optim.Adam, [fused], fused=True)
    before = plain._version
    fused_steps.mark_fused_steps(torch.optim.Adam([plain], lr=0.1), (), {})
    assert plain._version == before
    versions = fused._version
    fused_steps.mark_fused_steps(optimizer, (), {})
    assert fused._version > versions


def test_the_hook_is_installed_once():
    handle = fused_steps._handle
    fused_steps.install()
    assert fused_steps._handle is handle is not None
