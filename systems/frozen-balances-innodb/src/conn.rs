//! Connection options of the product.
//!
//! MySQL's affected-rows count is the number of rows an UPDATE *changed*, not the number
//! it matched, unless the client sets the `CLIENT_FOUND_ROWS` capability (MySQL
//! reference manual, `mysql_affected_rows()`). The product asks for found rows, so an
//! UPDATE that matched its row but left it unchanged still counts 1, as on PostgreSQL.

/// The product's options on top of `base` (host, port, user, database):
/// `CLIENT_FOUND_ROWS` on, TCP only.
pub fn product_opts(base: mysql_async::OptsBuilder) -> mysql_async::Opts {
    base.client_found_rows(true).prefer_socket(false).into()
}

/// A product connection.
///
/// Errors: the client's (unreachable server, unknown database).
pub async fn connect(
    base: mysql_async::OptsBuilder,
) -> Result<mysql_async::Conn, crate::InnoError> {
    Ok(mysql_async::Conn::new(product_opts(base)).await?)
}
