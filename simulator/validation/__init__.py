"""The simulator against measurements: operator and serving CSVs, predictions, calibration.

See docs/VALIDATION.md for the formats, the commands and the recorded errors.
"""
