"""Forward hooks that read a decoder block's structure from the tensors it passes around.

For each block: its input (the residual stream), what its attention module and its MLP return,
and which of its other children (norms) read those outputs (a norm between the heads and the
residual: Gemma 2/3, OLMo 2) or feed the MLP. Where the MLP reads from decides the block's kind:
the attention's own input or the block's input (parallel residual: GPT-J, NeoX, Falcon) or the
stream after the attention (sequential). Each block is checked to be exactly input + attention +
MLP; anything else is kept as the block's ``problem`` and refused by `attnviz.explain.residual`.
Tensors are compared by address only while both are held, so an equal address is the same tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..errors import AttnvizError
from ..loading import Hook
from .norms import FrozenNorm, close, identify, sums_to

Residual = Literal["sequential", "parallel"]
MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe")


class Unsupported(AttnvizError):
    """This model's blocks are not ones the explanations can decompose exactly (says why)."""


def _first_tensor(x: Any) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, tuple | list) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return None


def _input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    return _first_tensor(args[0]) if args else _first_tensor(kwargs.get("hidden_states"))


def _reads_mid(pre: torch.Tensor, added: torch.Tensor, source: torch.Tensor, dtype: torch.dtype) -> bool:
    """``source`` is input + attention (checked on 8 rows spread over the text: a structure check;
    the block's full sum is checked on every row when it ends)."""
    n = pre.shape[-2]
    rows = torch.linspace(0, n - 1, min(n, 8)).long().to(pre.device)
    pick = lambda t: t.index_select(-2, rows)  # noqa: E731
    return sums_to(pick(source), [pick(pre), pick(added)], dtype)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """The very same tensor data (both are held, so equal addresses cannot be a reused block)."""
    return a is not None and b is not None and a.data_ptr() == b.data_ptr() and a.shape == b.shape


@dataclass
class Block:
    """What the hooks saw inside one block. Tensors are held until the block ends, so an equal
    address means the very same tensor (the memory of a freed one cannot be reused meanwhile)."""

    pre: torch.Tensor | None = None
    attn_in: torch.Tensor | None = None
    attn_out: torch.Tensor | None = None  # the module's own output tensor (its pointer matters)
    attn_added: torch.Tensor | None = None
    attn_norm: FrozenNorm | None = None
    mlp_out: torch.Tensor | None = None
    mlp_added: torch.Tensor | None = None
    residual: Residual | None = None
    children: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # (input, output)
    problem: str = ""


class BlockHooks:
    """Forward hooks on every decoder block and its direct children for one forward pass
    (``hooks``, for `LoadedModel.forward`, which registers them for this thread's forward only)."""

    def __init__(self, layers: list[Any], attn: list[Any], dtype: torch.dtype) -> None:
        self.dtype, self.attn = dtype, attn
        self.stream: list[torch.Tensor] = []
        self.last_out: torch.Tensor | None = None
        self.blocks: list[Block] = []
        self.rotary: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        self.hooks: list[Hook] = []
        for i, layer in enumerate(layers):
            self.hooks += [
                Hook(layer, self._enter(i), "before", with_kwargs=True),
                Hook(layer, self._leave(i)),
            ]
            for name, child in layer.named_children():
                if isinstance(child, torch.nn.Dropout):
                    continue
                if child is attn[i]:
                    self.hooks += [
                        Hook(child, self._attn_in, "before", with_kwargs=True),
                        Hook(child, self._attn_out),
                    ]
                elif name in MLP_NAMES:
                    self.hooks += [
                        Hook(child, self._mlp_in, "before", with_kwargs=True),
                        Hook(child, self._mlp_out),
                    ]
                else:
                    self.hooks.append(Hook(child, self._child(name), with_kwargs=True))

    @property
    def block(self) -> Block:
        if not self.blocks:  # XLM, LongCat-Flash: the attention runs outside the blocks found
            raise Unsupported(
                "the attention runs before any block the trace found (its layers are not blocks)"
            )
        return self.blocks[-1]

    def _enter(self, i: int):
        def hook(_module, args, kwargs):
            x = _input(args, kwargs)
            if x is None or x.dim() != 3 or x.shape[0] != 1:
                raise Unsupported(f"block {i} gets no (1, tokens, d_model) hidden states")
            if i == 0:
                self.stream.append(x.detach().clone())
            elif not (_same(x, self.last_out) or close(x, self.stream[-1], self.dtype)):
                self.blocks[-1].problem = f"something between block {i - 1} and block {i} changes the stream"
            self.blocks.append(Block(pre=x))
            pe = kwargs.get("position_embeddings")
            self.rotary.append(tuple(t.detach() for t in pe) if isinstance(pe, tuple) else None)  # type: ignore[misc]

        return hook

    def _leave(self, i: int):
        def hook(_module, _args, output):
            b, post = self.block, _first_tensor(output)
            if post is None or b.pre is None:  # HRM: a block run again inside another one's forward
                raise Unsupported(f"block {i} returns no tensor, or runs again before it returns")
            if b.attn_added is None or b.mlp_added is None or b.residual is None:
                b.problem = b.problem or (
                    f"block {i}: could not find its attention output, its MLP ({'/'.join(MLP_NAMES)}) "
                    "or where the MLP reads from"
                )
            elif not sums_to(post, [b.pre, b.attn_added, b.mlp_added], self.dtype):
                b.problem = (
                    f"block {i}'s output is not its input + attention + MLP (a residual multiplier or "
                    "another term); the parts would not add up to it"
                )
            self.stream.append(post.detach().clone())
            self.last_out = post  # the next block's input is normally this very tensor
            b.pre, b.attn_in, b.children, b.attn_out, b.mlp_out = None, None, [], None, None

        return hook

    def _attn_in(self, _module, args, kwargs):
        self.block.attn_in = _input(args, kwargs)

    def _attn_out(self, _module, _args, output):
        out = _first_tensor(output)
        assert out is not None
        self.block.attn_out = out
        self.block.attn_added = out.detach().clone()  # until a norm reads it

    def _mlp_in(self, _module, args, kwargs):
        b, x = self.block, _input(args, kwargs)
        assert x is not None and b.pre is not None
        if _same(x, b.attn_in):
            b.residual = "parallel"  # the MLP reads what the attention reads (GPT-J, Falcon)
            return
        source = next((c[0] for c in b.children if _same(c[1], x)), x)  # a norm in front of the MLP
        if _same(source, b.pre):
            b.residual = "parallel"  # the MLP's norm reads the block's input (NeoX)
        elif b.attn_added is not None and _reads_mid(b.pre, b.attn_added, source, self.dtype):
            b.residual = "sequential"
        else:
            b.problem = (
                f"block {len(self.blocks) - 1}: the MLP reads neither the block's input nor input + "
                "attention (a residual multiplier, or another term between them)"
            )

    def _mlp_out(self, _module, _args, output):
        out = _first_tensor(output)
        assert out is not None
        self.block.mlp_out = out
        self.block.mlp_added = out.detach().clone()  # Falcon adds into it in place later

    def _child(self, name: str):
        def hook(module, args, kwargs, output):
            b, x, y = self.block, _input(args, kwargs), _first_tensor(output)
            if x is None or y is None:
                return
            b.children.append((x, y))
            if b.attn_out is not None and b.mlp_out is None and _same(x, b.attn_out):
                b.attn_added, b.attn_norm = y.detach().clone(), identify(module, x[0], y[0], name)
                if b.attn_norm is None:
                    b.problem = (
                        f"{type(module).__name__} between the heads and the residual is not a known norm"
                    )
            elif _same(x, b.mlp_out):
                b.mlp_added = y.detach().clone()

        return hook
