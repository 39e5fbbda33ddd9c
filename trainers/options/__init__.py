"""What each option means: the one TrainConfig, the model and tracker names, the table of
trainers and the output paths. Imports no torch."""
