"""Streamlit helpers shared by the pages: URL state, cached loaders, sidebar, errors, export.

Layout rule: pages -> ui -> attnviz. Only this package and the page scripts import Streamlit.
"""
