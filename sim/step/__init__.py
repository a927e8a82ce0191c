"""One decode step: compute, the link and host gather, the recall model, and the layer pipelines."""
