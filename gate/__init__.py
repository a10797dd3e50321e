"""The gate: adapter format, prompt layout, threshold policy, training and calibration."""
