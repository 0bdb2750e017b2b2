"""Reading results and showing them: tables, CSV and JSON for operators. Never writes a ledger."""
