"""The TrainJob domain: effective pod specs of each replicated job and demand arithmetic."""
