Matrix = list[list[float]]


def identity(n: int) -> Matrix:
    return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]


def transpose(m: Matrix) -> Matrix:
    return [list(row) for row in zip(*m)]


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """Product of an n x k and a k x m matrix."""
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions do not match")
    columns = transpose(b)
    return [[sum(x * y for x, y in zip(row, col)) for col in columns] for row in a]


def determinant(m: Matrix) -> float:
    """Determinant by Gaussian elimination with partial pivoting."""
    n = len(m)
    work = [row[:] for row in m]
    det = 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(work[r][col]))
        if abs(work[pivot][col]) < 1e-12:
            return 0.0
        if pivot != col:
            work[col], work[pivot] = work[pivot], work[col]
            det = -det
        det *= work[col][col]
        for row in range(col + 1, n):
            factor = work[row][col] / work[col][col]
            for k in range(col, n):
                work[row][k] -= factor * work[col][k]
    return det


def trace(m: Matrix) -> float:
    return sum(m[i][i] for i in range(len(m)))


def power(m: Matrix, exponent: int) -> Matrix:
    """m raised to a non-negative integer power by repeated squaring."""
    result = identity(len(m))
    base = m
    while exponent > 0:
        if exponent % 2 == 1:
            result = matmul(result, base)
        base = matmul(base, base)
        exponent //= 2
    return result


def format_matrix(m: Matrix, digits: int = 2) -> str:
    """One line per row, columns right-aligned."""
    cells = [[f"{x:.{digits}f}" for x in row] for row in m]
    width = max(len(c) for row in cells for c in row)
    return "\n".join(" ".join(c.rjust(width) for c in row) for row in cells)
