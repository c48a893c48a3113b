"""Tests of hybridflow.algorithms (pure tensor math, CPU)."""
