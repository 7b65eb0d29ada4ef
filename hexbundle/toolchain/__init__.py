"""The pinned toolchain: the docker client, the toolchain image, the Python wheelhouse."""
