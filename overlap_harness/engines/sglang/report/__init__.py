"""What the SGLang runs write: the loop report beside the model, the necessity table, the
sites no variant reaches and why, and the differences between releases."""
