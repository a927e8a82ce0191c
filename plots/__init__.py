"""Figures from result tables: DataFrames in, matplotlib Figures out. Not built yet: see the plots issue."""
