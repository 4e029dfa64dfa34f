"""The load report every weight adapter fills: what a load matched, resized, dropped, and why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadReport:
    """What ``load_pretrained`` did: keys the model lacked / the checkpoint lacked / resized."""

    format: str
    missing: list[str] = field(default_factory=list)  # model keys not found in the checkpoint
    unexpected: list[str] = field(default_factory=list)  # checkpoint keys the model has no use for
    resized: list[str] = field(default_factory=list)  # loaded after interpolation / inflation
    dropped: list[str] = field(default_factory=list)  # shape mismatch we cannot resize (e.g. head)
    skipped: list[str] = field(default_factory=list)  # checkpoint keys left out on purpose (fresh projection)
    remapped: list[str] = field(default_factory=list)  # head rows picked by a label map (Kinetics-710 -> 400/...)
    fresh: list[str] = field(default_factory=list)  # model keys initialised anew on purpose (not "missing")
    notes: list[str] = field(default_factory=list)  # decisions the load took, in words

    def summary(self) -> str:
        def short(keys: list[str]) -> str:
            return ", ".join(keys[:6]) + (f", ... (+{len(keys) - 6})" if len(keys) > 6 else "")

        parts = [f"format={self.format}"]
        for name in ("missing", "unexpected", "resized", "dropped", "skipped", "fresh", "remapped"):
            keys = getattr(self, name)
            if keys:
                parts.append(f"{name}={len(keys)} [{short(keys)}]")
        return " ".join(parts + [f"({n})" for n in self.notes])
