"""What a build is: TOML schemas and loading (build, model, device, toolchain pin), the model
description, and the layout that derives every path."""
