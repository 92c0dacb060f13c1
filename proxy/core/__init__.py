"""The bottom layer: the error classes with their wire codes, and the plain value types every layer passes around."""
