import math
from typing import NamedTuple


class Point(NamedTuple):
    x: float
    y: float


def distance(a: Point, b: Point) -> float:
    """Euclidean distance between two points."""
    return math.hypot(b.x - a.x, b.y - a.y)


def midpoint(a: Point, b: Point) -> Point:
    return Point((a.x + b.x) / 2, (a.y + b.y) / 2)


def polygon_area(points: list[Point]) -> float:
    """Area of a simple polygon by the shoelace formula; the points go around the boundary once."""
    n = len(points)
    if n < 3:
        return 0.0
    twice_area = 0.0
    for i in range(n):
        j = (i + 1) % n
        twice_area += points[i].x * points[j].y - points[j].x * points[i].y
    return abs(twice_area) / 2


def perimeter(points: list[Point]) -> float:
    return sum(distance(points[i], points[(i + 1) % len(points)]) for i in range(len(points)))


def circle_area(radius: float) -> float:
    if radius < 0:
        raise ValueError("radius must not be negative")
    return math.pi * radius**2


def triangle_kind(a: float, b: float, c: float) -> str:
    """'equilateral', 'isosceles', 'scalene', or 'invalid' when the sides cannot form a triangle."""
    x, y, z = sorted((a, b, c))
    if x <= 0 or x + y <= z:
        return "invalid"
    if x == z:
        return "equilateral"
    if x == y or y == z:
        return "isosceles"
    return "scalene"


def rotate(p: Point, angle_degrees: float, center: Point = Point(0.0, 0.0)) -> Point:
    """Rotate p counterclockwise around center."""
    theta = math.radians(angle_degrees)
    dx, dy = p.x - center.x, p.y - center.y
    return Point(
        center.x + dx * math.cos(theta) - dy * math.sin(theta),
        center.y + dx * math.sin(theta) + dy * math.cos(theta),
    )


def bounding_box(points: list[Point]) -> tuple[Point, Point]:
    xs = [p.x for p in points]
    ys = [p.y for p in points]
    return Point(min(xs), min(ys)), Point(max(xs), max(ys))
