"""Maintenance between cycles: the merge of small files, snapshot expiry and orphan files, table
retention and topic deletion, and a table-less topic's entries let go below its log start."""
