"""The test suite (a package, so that test folders can import ``tests.helpers``)."""
