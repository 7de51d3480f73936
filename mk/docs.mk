# The docs site (mkdocs.yml, docs/): generated pages first (tools/docsite/docgen.py), then a strict
# build (a broken link or anchor, a page outside the nav: an error) into build/site.
# tests/test_docs_site.py runs the same strict build in make test.
.PHONY: docs docs-gen docs-serve

docs: docs-gen
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir build/site

# the pages generated from code and from bench/results.json (README's figures too); --check in the tests
docs-gen:
	$(PYTHON) tools/docsite/docgen.py

docs-serve: docs-gen
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs serve --strict
