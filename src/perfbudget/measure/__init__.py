"""Measurements as plain functions: timing, operators, memory, compile health, numerics, occupancy, NVML, energy, padding."""
