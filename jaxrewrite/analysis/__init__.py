"""What the passes ask of a jaxpr: exactness of float ops, index maps of static gathers, pieces
of data movement, structural identity of equations."""
