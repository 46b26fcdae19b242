"""Pure core: parsing, metric catalogues, statistics, GPU and capacity maths.

Nothing in this package imports Textual, Rich or does network I/O.
"""
