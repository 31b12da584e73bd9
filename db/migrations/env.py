"""Alembic's entry point: migrate the connection that db.migrate hands over, inside its transaction."""
from alembic import context

from db.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
