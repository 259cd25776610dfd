"""Where offloaded tensors live between uses: host buffers and their swap files."""
