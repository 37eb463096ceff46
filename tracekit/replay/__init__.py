"""Topology model, flow decomposition and the numba flow simulator."""
