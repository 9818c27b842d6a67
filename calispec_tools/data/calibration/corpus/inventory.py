"""A small inventory of parts for a bicycle workshop: stock levels, reorders and a daily report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Part:
    code: str
    name: str
    quantity: int = 0
    reorder_level: int = 5
    suppliers: list[str] = field(default_factory=list)

    def needs_reorder(self) -> bool:
        return self.quantity <= self.reorder_level


class Inventory:
    def __init__(self) -> None:
        self._parts: dict[str, Part] = {}

    def add_part(self, part: Part) -> None:
        if part.code in self._parts:
            raise ValueError(f"part {part.code} is already listed")
        self._parts[part.code] = part

    def receive(self, code: str, amount: int) -> int:
        if amount <= 0:
            raise ValueError("amount must be positive")
        part = self._parts[code]
        part.quantity += amount
        return part.quantity

    def take(self, code: str, amount: int = 1) -> int:
        part = self._parts[code]
        if amount > part.quantity:
            raise ValueError(f"only {part.quantity} of {part.name} left")
        part.quantity -= amount
        return part.quantity

    def low_stock(self) -> list[Part]:
        return sorted((p for p in self._parts.values() if p.needs_reorder()), key=lambda p: p.quantity)

    def report(self) -> str:
        lines = [f"{p.code:<8} {p.name:<24} {p.quantity:>5}" for p in sorted(self._parts.values(), key=lambda p: p.code)]
        low = ", ".join(p.name for p in self.low_stock()) or "nothing"
        return "\n".join([*lines, f"reorder: {low}"])


def total_quantity(parts: list[Part]) -> int:
    """Sum of the quantities of all parts."""
    total = 0
    for part in parts:
        total += part.quantity
    return total


def find_by_supplier(parts: list[Part], supplier: str) -> list[str]:
    """Names of the parts a supplier can deliver, in alphabetical order."""
    return sorted(part.name for part in parts if supplier in part.suppliers)


if __name__ == "__main__":
    shop = Inventory()
    shop.add_part(Part("CH-01", "chain 11-speed", 12, 4, ["Alpine", "Ridgeway"]))
    shop.add_part(Part("TB-26", "inner tube 26 inch", 3, 10, ["Ridgeway"]))
    shop.add_part(Part("BP-02", "brake pads, disc", 7, 6, ["Alpine"]))
    shop.take("TB-26", 2)
    shop.receive("BP-02", 10)
    print(shop.report())
