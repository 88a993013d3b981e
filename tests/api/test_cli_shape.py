"""`--shape` of the CLI's layer commands: the fields of a layer, pairs as 1x2, and a clear
message naming what is wrong."""

from __future__ import annotations

import click
import pytest

from api.cli import _parse_shape
from kernels.spec import ConvShape


def test_fields_pairs_two_inputs_and_a_residual() -> None:
    assert _parse_shape("n=8,h=56,w=56,c=64,k=64,r=3,s=3,pad=1,stride=1x2") == \
        ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1), stride=(1, 2))
    assert _parse_shape("n=8,h=56,w=56,c=384,k=512,r=1,s=1,stride=2,concat=128").concat == 128
    res = _parse_shape("n=8,h=56,w=56,c=64,k=256,r=1,s=1,residual=1")
    assert res == ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True)
    assert not _parse_shape("n=8,h=56,w=56,c=64,k=256,r=1,s=1,residual=0").residual
    assert _parse_shape("n=8,h=56,w=56,c=64,k=256,r=1,s=1,residual=1,b2b=64").b2b == 64


@pytest.mark.parametrize("text,words", [
    ("n=8,h=56,w=56,c=64,k=64,r=3,s=3,residual=2", "residual"),
    ("n=8,h=56,w=56,c=64,k=64,r=3,s=3,residual=yes", "not an integer"),
    ("n=8,h=56,w=56,c=64,k=64,r=3", "missing s"),
    ("n=8,h=56,w=56,c=64,k=64,r=3,s=3,groups=2", "groups"),
])
def test_a_bad_shape_names_the_field(text: str, words: str) -> None:
    with pytest.raises(click.BadParameter, match=words):
        _parse_shape(text)
