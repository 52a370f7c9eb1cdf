//! Assets, the two markets and order sides (SPEC §8 "Model").
//!
//! Every amount in the database is an integer number of an asset's minor units (`bigint`):
//! 1 USDT = 1 000 000 units (scale 6), 1 BTC = 1 ETH = 100 000 000 units (scale 8).
//! Decimal text exists only at the edge ([`crate::amount`]). The second market,
//! `ETH-USDT`, shares the quote asset with `BTC-USDT`: one USDT balance serves both (F17).

use serde::{Deserialize, Serialize};

/// An asset with its scale and its largest accepted amount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Asset {
    /// Tether, the quote asset: scale 6, at most 1 000 000 000 000 USDT per amount.
    Usdt,
    /// Bitcoin, the base asset of BTC-USDT: scale 8, at most 21 000 000 BTC per amount.
    Btc,
    /// Ether, the base asset of ETH-USDT: scale 8, at most 1 000 000 000 ETH per amount.
    Eth,
}

impl Asset {
    /// Every asset, in the order the database sorts their names (`BTC` < `ETH` < `USDT`).
    pub const ALL: [Asset; 3] = [Asset::Btc, Asset::Eth, Asset::Usdt];

    /// The assets of the first market, seeded for every seeded account; ETH rows are
    /// created on demand by the events.
    pub const SEEDED: [Asset; 2] = [Asset::Btc, Asset::Usdt];

    /// The stored spelling, `"USDT"`, `"BTC"` or `"ETH"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Asset::Usdt => "USDT",
            Asset::Btc => "BTC",
            Asset::Eth => "ETH",
        }
    }

    /// Decimal places: 6 for USDT, 8 for BTC and ETH.
    pub fn scale(self) -> u32 {
        match self {
            Asset::Usdt => USDT_SCALE,
            Asset::Btc => BTC_SCALE,
            Asset::Eth => ETH_SCALE,
        }
    }

    /// Minor units in one whole coin: 10^scale.
    pub fn units_per_coin(self) -> i64 {
        10_i64.pow(self.scale())
    }

    /// The largest amount accepted for one request, in minor units (USDT: 10^12 coins =
    /// 10^18 units; BTC: 21 × 10^6 coins = 2.1 × 10^15 units). Both fit `bigint`.
    pub fn max_units(self) -> i64 {
        match self {
            Asset::Usdt => USDT_MAX_COINS * self.units_per_coin(),
            Asset::Btc => BTC_MAX_COINS * self.units_per_coin(),
            Asset::Eth => ETH_MAX_COINS * self.units_per_coin(),
        }
    }
}

/// USDT decimal places.
pub const USDT_SCALE: u32 = 6;
/// BTC decimal places.
pub const BTC_SCALE: u32 = 8;
/// Largest USDT amount per request, whole coins.
pub const USDT_MAX_COINS: i64 = 1_000_000_000_000;
/// Largest BTC amount per request, whole coins.
pub const BTC_MAX_COINS: i64 = 21_000_000;
/// ETH decimal places (the chain's 18 are more than a `bigint` of large balances can
/// hold; exchanges keep 8 or fewer for trading).
pub const ETH_SCALE: u32 = 8;
/// Largest ETH amount per request, whole coins (10^17 units, within `bigint`).
pub const ETH_MAX_COINS: i64 = 1_000_000_000;

/// A buy or a sell order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Side {
    /// Freezes the quote asset (`quantity × limit` plus the fee reserve).
    Buy,
    /// Freezes the base asset (`quantity`).
    Sell,
}

impl Side {
    /// Both sides.
    pub const ALL: [Side; 2] = [Side::Buy, Side::Sell];

    /// The stored spelling, `"BUY"` or `"SELL"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Buy => "BUY",
            Side::Sell => "SELL",
        }
    }
}

/// A spot market: base and quote asset, price tick and quantity lot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Market {
    /// `BTC-USDT`: tick 0.01 USDT, lot 0.0001 BTC, price at most 10 000 000 USDT per BTC.
    #[serde(rename = "BTC-USDT")]
    BtcUsdt,
    /// `ETH-USDT`: tick 0.01 USDT, lot 0.0001 ETH, price at most 10 000 000 USDT per ETH.
    #[serde(rename = "ETH-USDT")]
    EthUsdt,
}

impl Market {
    /// Every market.
    pub const ALL: [Market; 2] = [Market::BtcUsdt, Market::EthUsdt];

    /// The name, `"BTC-USDT"` or `"ETH-USDT"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Market::BtcUsdt => "BTC-USDT",
            Market::EthUsdt => "ETH-USDT",
        }
    }

    /// The asset bought and sold (BTC or ETH).
    pub fn base(self) -> Asset {
        match self {
            Market::BtcUsdt => Asset::Btc,
            Market::EthUsdt => Asset::Eth,
        }
    }

    /// The asset prices and fees are paid in (USDT).
    pub fn quote(self) -> Asset {
        Asset::Usdt
    }

    /// Price step in quote units per whole base coin: 0.01 USDT = 10 000 units.
    pub fn tick_units(self) -> i64 {
        match self {
            Market::BtcUsdt => BTC_USDT_TICK_UNITS,
            Market::EthUsdt => ETH_USDT_TICK_UNITS,
        }
    }

    /// Quantity step in base units: 0.0001 BTC or ETH = 10 000 units.
    pub fn lot_units(self) -> i64 {
        match self {
            Market::BtcUsdt => BTC_USDT_LOT_UNITS,
            Market::EthUsdt => ETH_USDT_LOT_UNITS,
        }
    }

    /// Highest price in quote units per whole base coin: 10 000 000 USDT.
    pub fn max_price_units(self) -> i64 {
        let coins = match self {
            Market::BtcUsdt => BTC_USDT_MAX_PRICE_COINS,
            Market::EthUsdt => ETH_USDT_MAX_PRICE_COINS,
        };
        coins * Asset::Usdt.units_per_coin()
    }

    /// The asset a `side` order freezes: the quote for a BUY, the base for a SELL.
    pub fn frozen_asset(self, side: Side) -> Asset {
        match side {
            Side::Buy => self.quote(),
            Side::Sell => self.base(),
        }
    }
}

/// BTC-USDT price tick, USDT units (0.01 USDT).
pub const BTC_USDT_TICK_UNITS: i64 = 10_000;
/// BTC-USDT quantity lot, BTC units (0.0001 BTC).
pub const BTC_USDT_LOT_UNITS: i64 = 10_000;
/// BTC-USDT highest price, whole USDT per BTC.
pub const BTC_USDT_MAX_PRICE_COINS: i64 = 10_000_000;
/// ETH-USDT price tick, USDT units (0.01 USDT).
pub const ETH_USDT_TICK_UNITS: i64 = 10_000;
/// ETH-USDT quantity lot, ETH units (0.0001 ETH).
pub const ETH_USDT_LOT_UNITS: i64 = 10_000;
/// ETH-USDT highest price, whole USDT per ETH.
pub const ETH_USDT_MAX_PRICE_COINS: i64 = 10_000_000;

enum_names::name_traits!(Asset, "asset");
enum_names::name_traits!(Side, "side");
enum_names::name_traits!(Market, "market");

/// Parse error of the `FromStr` impls in this module (the systems' one,
/// [`enum_names::UnknownName`]).
pub use enum_names::UnknownName;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_case_sensitively() {
        for a in Asset::ALL {
            assert_eq!(a.as_str().parse::<Asset>(), Ok(a));
        }
        for s in Side::ALL {
            assert_eq!(s.as_str().parse::<Side>(), Ok(s));
        }
        assert_eq!("BTC-USDT".parse::<Market>(), Ok(Market::BtcUsdt));
        assert_eq!("ETH-USDT".parse::<Market>(), Ok(Market::EthUsdt));
        assert_eq!(Market::EthUsdt.base(), Asset::Eth);
        for bad in ["usdt", "eth", ""] {
            assert!(bad.parse::<Asset>().is_err());
        }
        for bad in ["buy", "Sell", "HOLD"] {
            assert!(bad.parse::<Side>().is_err());
        }
        for bad in ["btc-usdt", "BTC/USDT", "ETH-BTC", "BTC-USDT "] {
            assert!(bad.parse::<Market>().is_err());
        }
    }

    #[test]
    fn scales_and_limits() {
        assert_eq!(Asset::Usdt.units_per_coin(), 1_000_000);
        assert_eq!(Asset::Btc.units_per_coin(), 100_000_000);
        assert_eq!(Asset::Usdt.max_units(), 1_000_000_000_000_000_000);
        assert_eq!(Asset::Btc.max_units(), 2_100_000_000_000_000);
        assert_eq!(Market::BtcUsdt.max_price_units(), 10_000_000_000_000);
        assert_eq!(Market::BtcUsdt.frozen_asset(Side::Buy), Asset::Usdt);
        assert_eq!(Market::BtcUsdt.frozen_asset(Side::Sell), Asset::Btc);
    }
}
