"""Sweeps: a sweep file expanded into points, run in this process, a process pool or on Ray, stored one row per point,
checked and reported."""
